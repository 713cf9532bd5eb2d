#!/usr/bin/env python3
"""The Aegis fault matrix as a measurement: every injected fault class through `zaya supervise`
with the real `zaya train` on a toy model, at 1 and 2 ranks, with the supervisor's default
detection (the hang timeout learned from the step times), and the heartbeat's cost.

For each class and world size, one supervised run meets the fault twice (at two random steps,
seeded: --seed reproduces them; attempt 1 and attempt 2). From <run>/aegis/incidents.jsonl it
reports, per incident, the time to detect (detection - the newest heartbeat before it) and the
time to recover (detection -> the next attempt's first new step: kill, back-off, launch, load,
first step), the steps recomputed, and whether the final checkpoint's tensors (weights and
optimizer state) are bitwise those of an undisturbed run (for NaN: one that skipped the same data
windows). Hangs are checked against the bar: detected within 2 x the step time + 10 s.

The heartbeat cost: the same run with train.heartbeat on and off, interleaved for --rounds rounds
(by default the toy model's steps of a few milliseconds, on one thread, where a fixed per-step
cost shows most; --cost-hidden widens the model). Per run: the median step time from metrics.jsonl,
and the CPU time of the whole process (user + system, the heartbeat writer thread included), which
a machine shared with other work disturbs far less than wall time.

    python3 benchmarks/aegis_matrix.py [--zaya build/cuda/zaya] [--out docs/results/aegis] [--seed S]

Writes <out>/matrix.md (the matrix; --classes '' skips it) and <out>/heartbeat-cost.md (the cost;
--rounds 0 skips it), each naming the command that made it; every run's row also goes to stdout
as one JSON line.
"""
import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toy_corpus import MODEL, write_corpus  # noqa: E402

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_WAIT_POLICY="PASSIVE")
def config(corpus, out, np_, steps, every, extra=""):
    return (MODEL + f'[data]\ntrain = ["{corpus}"]\n[train]\nsteps = {steps}\nmicro_batch = 1\nseq_len = 16\n'
            f"grad_accum = {2 // np_}\neval_every = 0\nprogress = false\nmax_skipped_steps = 1\n{extra}"
            f'out_dir = "{out}"\n[optim]\nlr = 3e-3\nwarmup_steps = 5\ntotal_steps = 1000\nbalance_lr = 1e-3\n'
            f"[ckpt]\nevery = {every}\nkeep_last = 1000\nsave_final = true\n[parallel]\ntimeout_s = 60\n")


def train_cmd(zaya, cfg, np_):
    return ([] if np_ == 1 else ["mpirun", "--oversubscribe", "-np", str(np_)]) + [
        zaya, "--threads", "1", "train", "--config", cfg]


def tensors_digest(run):
    """sha256 over every tensor's name and bytes in the run's newest checkpoint (headers aside)."""
    latest = open(os.path.join(run, "latest")).read().strip()
    step = os.path.join(run, latest)
    h = hashlib.sha256()
    for name in sorted(os.listdir(step)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(step, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        for t in sorted(k for k in header if k != "__metadata__"):
            a, b = header[t]["data_offsets"]
            h.update(t.encode())
            h.update(data[a:b])
    return h.hexdigest()


def median_step_time(run):
    times = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "step_time" in j:
                times.append(j["step_time"])
            elif "time" in j and isinstance(j["time"], dict) and "step" in j["time"]:
                times.append(j["time"]["step"])
    return statistics.median(times) if times else None


def faults(cls, a, b, rank, every):
    if cls == "crash":
        return [f"kill@step={a},rank={rank},attempt=1", f"kill@step={b},rank={rank},attempt=2"]
    if cls == "exit":
        return [f"exit@step={a},code=1,rank={rank},attempt=1", f"exit@step={b},code=7,rank={rank},attempt=2"]
    if cls == "hang":
        return [f"hang@step={a},rank={rank},attempt=1", f"hang@step={b},rank={rank},attempt=2"]
    if cls == "nan":
        return [f"nan@step={a},rank={rank},attempt=1", f"nan@step={b},rank={rank},attempt=2"]
    if cls == "corrupt-ckpt":  # a, b checkpoint steps; a kill before the next checkpoint makes it matter
        return [f"corrupt-ckpt@step={a},rank={rank},attempt=1", f"kill@step={a + 1},attempt=1",
                f"corrupt-ckpt@step={b},rank={rank},attempt=2", f"kill@step={b + 1},attempt=2"]
    if cls == "kill-during-save":
        return [f"kill-during-save@step={a},rank={rank},attempt=1", f"kill-during-save@step={b},rank={rank},attempt=2"]
    if cls == "slow":
        return [f"slow@rank={rank},factor=20,step={a}"]
    raise ValueError(cls)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zaya", default="build/cuda/zaya")
    ap.add_argument("--out", default="docs/results/aegis")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--classes", default="crash,exit,hang,nan,corrupt-ckpt,kill-during-save,slow")
    ap.add_argument("--cost-steps", type=int, default=1000)
    ap.add_argument("--cost-threads", type=int, default=1)
    ap.add_argument("--cost-hidden", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    zaya = os.path.abspath(args.zaya)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    tmp = tempfile.mkdtemp(prefix="zaya_aegis_bench_")
    corpus = os.path.join(tmp, "toy")
    write_corpus(corpus)
    steps, every = args.steps, args.every
    results, refs = [], {}

    def run_train(name, np_, extra_args=()):
        out = os.path.join(tmp, name)
        cfg = out + ".toml"
        open(cfg, "w").write(config(corpus, out, np_, steps, every))
        p = subprocess.run(train_cmd(zaya, cfg, np_) + list(extra_args), env=ENV, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{name}: zaya train failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        return out

    for np_ in [int(x) for x in args.ranks.split(",")] if [c for c in args.classes.split(",") if c] else []:
        ref = run_train(f"ref{np_}", np_)
        refs[np_] = (tensors_digest(ref), median_step_time(ref))
        for cls in [c for c in args.classes.split(",") if c]:
            if cls == "slow" and np_ == 1:
                continue  # slowness is relative to the other ranks
            if cls in ("corrupt-ckpt", "kill-during-save"):
                a, b = sorted(rng.sample(range(2 * every, steps - 1, every), 2))
            elif cls == "slow":
                a, b = rng.randrange(2, 8), None
            else:
                a, b = sorted(rng.sample(range(every + 1, steps - 1), 2))
            rank = rng.randrange(np_)
            name = f"{cls}{np_}"
            out = os.path.join(tmp, name)
            cfg = out + ".toml"
            open(cfg, "w").write(config(corpus, out, np_, steps, every))
            cmd = [zaya, "supervise", "--backoff", "0.1", "--progress-every", "0", "--quiet-job", "--"] + \
                train_cmd(zaya, cfg, np_)
            for f in faults(cls, a, b, rank, every):
                cmd += ["--inject", f]
            t0 = time.time()
            p = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
            wall = time.time() - t0
            incidents = [json.loads(l) for l in open(os.path.join(out, "aegis", "incidents.jsonl"))] \
                if os.path.exists(os.path.join(out, "aegis", "incidents.jsonl")) else []
            if cls == "nan":
                state = json.load(open(os.path.join(out, "aegis", "state.json")))
                skips = [x for w in state["skip_windows"] for x in ("--skip-samples", f"{w[0]}:{w[1]}")]
                want = tensors_digest(run_train(f"nanref{np_}", np_, skips))
            else:
                want = refs[np_][0]
            same = p.returncode == 0 and tensors_digest(out) == want
            step_t = refs[np_][1] or 0.0
            row = dict(cls=cls, ranks=np_, steps=[a] if b is None else [a, b], rank=rank, rc=p.returncode,
                       wall_s=round(wall, 2), identical=same, step_time_s=step_t, incidents=[
                           dict(cls=i["class"], detect_s=i["time_to_detect_s"], recover_s=i.get("time_to_recover_s"),
                                steps_lost=i["steps_lost"], failed_step=i["failed_step"],
                                evidence=i["evidence"].replace(tmp, "$TMP")[:160]) for i in incidents],
                       command=" ".join(cmd).replace(tmp, "$TMP").replace(zaya, "zaya"))
            if cls == "hang":
                row["hang_bar_s"] = 2 * step_t + 10
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "command"}), flush=True)

    # The heartbeat's cost: a loaded run, interleaved on and off.
    cost = {"on": [], "off": []}
    cpu = {"on": [], "off": []}
    big = MODEL if args.cost_hidden == 32 else MODEL.replace("hidden_size = 32", f"hidden_size = {args.cost_hidden}").replace(
        "moe_intermediate_size = 32", f"moe_intermediate_size = {args.cost_hidden}").replace(
        "router_hidden_size = 32", f"router_hidden_size = {args.cost_hidden}").replace(
        "num_attention_heads = 2", "num_attention_heads = 4").replace("head_dim = 16", "head_dim = 64")
    for r in range(args.rounds):
        for mode in ("on", "off"):
            out = os.path.join(tmp, f"cost_{mode}_{r}")
            cfg = out + ".toml"
            text = config(corpus, out, 1, args.cost_steps, 0, f"heartbeat = {'true' if mode == 'on' else 'false'}\n")
            open(cfg, "w").write(big + text[len(MODEL):])
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            p = subprocess.run([zaya, "--threads", str(args.cost_threads), "train", "--config", cfg,
                                "--set", "ckpt.save_final=false"], env=ENV, capture_output=True, text=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode != 0:
                sys.exit(f"cost run failed:\n{p.stderr[-3000:]}")
            cost[mode].append(median_step_time(out))
            cpu[mode].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            shutil.rmtree(out, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    command = (f"python3 benchmarks/aegis_matrix.py --seed {seed}" + (f" --steps {steps}" if steps != 40 else "")
               + (f" --every {every}" if every != 5 else ""))
    if results:
        lines = ["# Aegis fault matrix", "",
                 f"Made by `{command} --rounds 0` (" + os.uname().nodename + f", {os.cpu_count()} CPUs). Toy model, {steps} steps, a checkpoint every"
                 f" {every}, global batch 2 sequences; `zaya supervise --backoff 0.1` with its default detection"
                 " (the hang timeout learned from the step times). Each run meets its fault at two steps (attempt 1"
                 " and attempt 2); `identical`: the final checkpoint's tensors are bitwise an undisturbed run's"
                 " (for NaN: one that skipped the same data windows). Detect: detection - the newest heartbeat"
                 " before it. Recover: detection -> the next attempt's first new step (kill, back-off, launch,"
                 " load, first step).", ""]
        for cls in [c for c in args.classes.split(",") if c]:
            rows = [r for r in results if r["cls"] == cls]
            if not rows:
                continue
            lines += [f"## {cls}", "", "| ranks | fault steps | incidents | detect s | recover s | steps lost | identical |"
                      + (" detected at step |" if cls == "slow" else ""), "|---|---|---|---|---|---|---|"
                      + ("---|" if cls == "slow" else "")]
            for r in rows:
                inc = r["incidents"]
                lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
                    r["ranks"], ", ".join(map(str, r["steps"])), ", ".join(i["cls"] for i in inc) or "none",
                    ", ".join(f"{i['detect_s']:.2f}" for i in inc),
                    ", ".join("-" if i["recover_s"] is None else f"{i['recover_s']:.2f}" for i in inc),
                    ", ".join(str(i["steps_lost"]) for i in inc), "yes" if r["identical"] else "**no**")
                    + (" {} |".format(", ".join(str(i["failed_step"]) for i in inc)) if cls == "slow" else ""))
            if cls == "hang":
                for r in rows:
                    worst = max([i["detect_s"] for i in r["incidents"] if i["cls"] == "hang"] or [float("nan")])
                    lines.append(f"\nHang bar at {r['ranks']} rank(s): 2 x {r['step_time_s']:.4f} s + 10 s = "
                                 f"{r['hang_bar_s']:.2f} s; slowest detection {worst:.2f} s: "
                                 + ("within" if worst <= r["hang_bar_s"] else "**over**"))
            lines.append("")
        open(os.path.join(args.out, "matrix.md"), "w").write("\n".join(lines))
        print("\n".join(lines))
    if args.rounds > 0:
        on, off = statistics.median(cost["on"]), statistics.median(cost["off"])
        cpu_on, cpu_off = statistics.median(cpu["on"]), statistics.median(cpu["off"])
        # Paired within each round (on and off run back to back): drift of a shared machine cancels.
        d_step = statistics.median(a - b for a, b in zip(cost["on"], cost["off"]))
        d_cpu = statistics.median(a - b for a, b in zip(cpu["on"], cpu["off"]))
        lines = ["# Heartbeat cost", "",
                 f"Made by `python3 benchmarks/aegis_matrix.py --classes '' --rounds {args.rounds}"
                 + (f" --cost-steps {args.cost_steps}" if args.cost_steps != 1000 else "") + "` ("
                 + os.uname().nodename + f", {os.cpu_count()} CPUs, shared with other work). "
                 f"A {args.cost_steps}-step run of the toy model (hidden {args.cost_hidden}, {args.cost_threads} "
                 f"thread(s), no checkpoints) with train.heartbeat on and off, {args.rounds} rounds of the two back"
                 " to back: the median step time of each run (metrics.jsonl), and each run's CPU time (user +"
                 " system, start-up included, the heartbeat writer thread included).", "",
                 "| heartbeats | median step s, per round | median | CPU s per run, per round | median |",
                 "|---|---|---|---|---|",
                 f"| on | {', '.join(f'{x:.5f}' for x in cost['on'])} | {on:.5f} | "
                 f"{', '.join(f'{x:.2f}' for x in cpu['on'])} | {cpu_on:.2f} |",
                 f"| off | {', '.join(f'{x:.5f}' for x in cost['off'])} | {off:.5f} | "
                 f"{', '.join(f'{x:.2f}' for x in cpu['off'])} | {cpu_off:.2f} |", "",
                 f"Median of the rounds' differences (on - off): step time {d_step * 1e3:+.3f} ms per step "
                 f"({d_step / off * 100:+.1f}%), CPU {d_cpu / args.cost_steps * 1e6:+.1f} µs per step "
                 f"({d_cpu / max(cpu_off, 1e-9) * 100:+.1f}% of the run's CPU time).", ""]
        open(os.path.join(args.out, "heartbeat-cost.md"), "w").write("\n".join(lines))
        print("\n".join(lines))
    shutil.rmtree(tmp, ignore_errors=True)
    bad = [r for r in results if not r["identical"]]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
