#!/usr/bin/env python3
"""Write a zaya run's metrics.jsonl as TensorBoard event files, once or following the run live.

    .venv/bin/python tools/metrics_to_tensorboard.py RUN_DIR [--follow] [--interval S] [--idle-exit S]
    .venv/bin/tensorboard --logdir RUN_DIR/tensorboard
    ... --wandb PROJECT   also log to Weights & Biases (the wandb package; WANDB_MODE=offline works)

A companion rather than part of the trainer: the trainer stays free of a TensorBoard dependency,
and runs that have already finished convert the same way as live ones.

Every numeric field of a record becomes a scalar at its step: loss, lr, grad_norm, tokens_per_s,
mfu, val_loss, ... and whatever fields later records carry; a list becomes one scalar per index
(expert_entropy/layer_0, ...), a nested object one per key (time/forward, data_parallel/buckets).
The wall time of an event is the record's own timestamp when it has one ("wall_time",
"timestamp" or "time_unix", seconds since the epoch), else the time it was read.

The event file (RUN_DIR/tensorboard/events.out.tfevents.*.zaya) is rewritten from the start of
metrics.jsonl at every start, so converting twice never shows a curve twice. A training record
whose step is not past the last one (a resume replaying steps, in files from before zaya dropped
replayed records) is preceded by a SessionLog START event at that step: TensorBoard then discards
what it holds from that step on, as tools/plot_metrics.py keeps the later records. With --follow a
torn last line (a record being written) waits for its newline.

With --wandb the same scalars go to a Weights & Biases run (named after RUN_DIR, files under
RUN_DIR/wandb). W&B cannot rewrite a step it has logged, so replayed steps keep the first records
there (counted in the closing line).
"""
import argparse
import glob
import json
import math
import os
import sys
import time

try:
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
except ImportError:  # the system Python: name the interpreter that has the package
    sys.exit("metrics_to_tensorboard: the tensorboard package is missing; run it with the project's venv "
             "(.venv/bin/python tools/metrics_to_tensorboard.py RUN_DIR), which scripts/setup.sh makes")

SUFFIX = ".zaya"  # marks the event files this tool owns, so it replaces only its own
AXES = ("step", "tokens")  # the x axis and a counter, not curves
WALL_TIME_KEYS = ("wall_time", "timestamp", "time_unix")


def scalars(record, prefix=""):
    """(tag, value) for every finite number in the record, lists and objects flattened."""
    for key, value in record.items():
        if not prefix and (key in AXES or key in WALL_TIME_KEYS):
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, bool):  # flags (clipped, skipped_update) plot as 0/1
            yield tag, float(value)
        elif isinstance(value, (int, float)):
            if math.isfinite(value):
                yield tag, float(value)
        elif isinstance(value, dict):
            yield from scalars(value, tag + "/")
        elif isinstance(value, list):
            name = "layer" if key.startswith("expert_") or key == "skip_fraction" else "i"
            for i, v in enumerate(value):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    yield f"{tag}/{name}_{i}", float(v)


class Converter:
    def __init__(self, run_dir, wandb_run=None):
        self.wandb_run = wandb_run
        self.wandb_step = -1
        self.wandb_skipped = 0
        self.metrics = os.path.join(run_dir, "metrics.jsonl")
        self.logdir = os.path.join(run_dir, "tensorboard")
        os.makedirs(self.logdir, exist_ok=True)
        for old in glob.glob(os.path.join(self.logdir, f"events.out.tfevents.*{SUFFIX}")):
            os.remove(old)
        self.writer = EventFileWriter(self.logdir, filename_suffix=SUFFIX)
        self.offset = 0       # bytes of metrics.jsonl consumed (complete lines only)
        self.line_no = 0
        self.last_train_step = None
        self.records = 0

    def write_record(self, record):
        step = record.get("step")
        if not isinstance(step, int) or "event" in record:  # event records (phase_start) are not curves
            return
        wall = next((record[k] for k in WALL_TIME_KEYS if isinstance(record.get(k), (int, float))), time.time())
        if "loss" in record:  # a training record; validation records share their step's
            if self.last_train_step is not None and step <= self.last_train_step:
                self.writer.add_event(Event(wall_time=wall, step=step, session_log=SessionLog(status=SessionLog.START)))
            self.last_train_step = step
        pairs = list(scalars(record))
        if pairs:
            values = [Summary.Value(tag=tag, simple_value=v) for tag, v in pairs]
            self.writer.add_event(Event(wall_time=wall, step=step, summary=Summary(value=values)))
            self.records += 1
            if self.wandb_run is not None:
                if step >= self.wandb_step:  # W&B takes steps in order only
                    self.wandb_run.log(dict(pairs), step=step)
                    self.wandb_step = step
                else:
                    self.wandb_skipped += 1

    def poll(self):
        """Converts the complete lines added since the last call; returns how many."""
        try:
            size = os.path.getsize(self.metrics)
        except FileNotFoundError:
            return 0
        if size < self.offset:  # replaced by a new file: start over
            print(f"metrics_to_tensorboard: {self.metrics} shrank; reading it from the start", file=sys.stderr)
            self.offset, self.line_no, self.last_train_step = 0, 0, None
        if size == self.offset:
            return 0
        with open(self.metrics, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        end = chunk.rfind(b"\n")
        if end < 0:
            return 0  # only part of a record so far
        n = 0
        for raw in chunk[:end].split(b"\n"):
            self.line_no += 1
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                sys.exit(f"metrics_to_tensorboard: {self.metrics}:{self.line_no}: not JSON")
            self.write_record(record)
            n += 1
        self.offset += end + 1
        self.writer.flush()
        return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="zaya run directory (holds metrics.jsonl)")
    ap.add_argument("--follow", action="store_true", help="keep converting records as the run writes them")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between checks with --follow")
    ap.add_argument("--idle-exit", type=float, default=0.0,
                    help="with --follow, stop after this many seconds without a new record (0: never)")
    ap.add_argument("--wandb", metavar="PROJECT", help="also log to this Weights & Biases project")
    a = ap.parse_args(argv)
    metrics = os.path.join(a.run_dir, "metrics.jsonl")
    if not os.path.isdir(a.run_dir):
        sys.exit(f"metrics_to_tensorboard: {a.run_dir} is not a directory")
    if not a.follow and not os.path.exists(metrics):
        sys.exit(f"metrics_to_tensorboard: {metrics} does not exist (is {a.run_dir} a zaya run directory?)")
    wandb_run = None
    if a.wandb:
        try:
            import wandb
        except ImportError:
            sys.exit("metrics_to_tensorboard: --wandb needs the wandb package (pip install wandb in the venv)")
        wandb_run = wandb.init(project=a.wandb, dir=a.run_dir, name=os.path.basename(os.path.abspath(a.run_dir)))
    conv = Converter(a.run_dir, wandb_run)
    conv.poll()
    if not a.follow and os.path.getsize(metrics) > conv.offset:
        print(f"metrics_to_tensorboard: {metrics}: skipping a torn last line (no newline)", file=sys.stderr)
    if a.follow:
        print(f"metrics_to_tensorboard: following {metrics} -> {conv.logdir} (Ctrl-C stops)", file=sys.stderr)
        last_new = time.monotonic()
        try:
            while not (a.idle_exit > 0 and time.monotonic() - last_new > a.idle_exit):
                time.sleep(a.interval)
                if conv.poll():
                    last_new = time.monotonic()
        except KeyboardInterrupt:
            pass
    conv.writer.close()
    print(f"metrics_to_tensorboard: {conv.records} records -> {conv.logdir}")
    if wandb_run is not None:
        wandb_run.finish()
        # finish() can return before W&B's service has written the run's file; teardown waits for
        # it (a script gets this at exit, a caller of main() in the same process would not).
        teardown = getattr(sys.modules["wandb"], "teardown", None)
        if teardown is not None:
            teardown()
        print(f"metrics_to_tensorboard: W&B project {a.wandb}" +
              (f" ({conv.wandb_skipped} replayed records kept at their first values)" if conv.wandb_skipped else ""))


if __name__ == "__main__":
    main()
