"""tools/metrics_to_tensorboard.py: TensorBoard's own reader (EventAccumulator, from the
tensorboard package) loads the scalars written from a real `zaya train` run's metrics.jsonl, from a
run that replayed steps after a resume (the later records win, as tools/plot_metrics.py keeps
them), and from a file that grows while --follow runs (a torn last line waits for its newline).

Tolerance: TensorBoard stores scalars as float32, so a value is compared with the JSON double to
float32's relative precision (2^-24 ~ 6e-8; 1e-6 allowed).

Run: ZAYA_BINARY=build/cuda/zaya .venv/bin/python -m pytest tests/python/test_metrics_to_tensorboard.py
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hf_full_export import RUN_TOML, WORDS  # noqa: E402
from test_hf_parity import zaya_binary  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "metrics_to_tensorboard.py"
spec = importlib.util.spec_from_file_location("metrics_to_tensorboard", TOOL)
m2tb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m2tb)


def accumulator(run):
    files = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1, files  # one file, however often the tool ran
    return EventAccumulator(str(run / "tensorboard")).Reload()


def curve(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def test_a_real_runs_metrics_load_in_tensorboard(tmp_path):
    import random
    rng = random.Random(1)
    (tmp_path / "corpus.txt").write_text(
        "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) for _ in range(400)) + "\n")
    (tmp_path / "data").mkdir()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    zaya = str(Path(zaya_binary()).resolve())
    subprocess.run([zaya, "data", "prepare", "--input", "corpus.txt", "--vocab", "300", "--out", "data/tiny"],
                   cwd=tmp_path, check=True, capture_output=True, env=env)
    (tmp_path / "tiny.toml").write_text(RUN_TOML.replace("steps = 2", "steps = 4"))
    subprocess.run([zaya, "train", "--config", "tiny.toml"], cwd=tmp_path, check=True, capture_output=True, env=env)
    run = tmp_path / "runs" / "tiny"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    val = [r for r in records if "val_loss" in r]
    assert len(train) == 4 and val
    for _ in range(2):  # converting again replaces the file instead of doubling the curves
        m2tb.main([str(run)])
    acc = accumulator(run)
    tags = set(acc.Tags()["scalars"])
    for tag in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "expert_entropy/layer_0",
                "expert_entropy/layer_1", "time/step"):
        assert tag in tags, (tag, sorted(tags))
    for tag in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
        got = curve(acc, tag)
        assert [s for s, _ in got] == [r["step"] for r in train], tag
        assert all(close(v, r[tag]) for (_, v), r in zip(got, train)), (tag, got)
    got = curve(acc, "expert_entropy/layer_1")
    assert all(close(v, r["expert_entropy"][1]) for (_, v), r in zip(got, train))
    assert [(s, round(v, 5)) for s, v in curve(acc, "val_loss")] == [(r["step"], round(r["val_loss"], 5)) for r in val]


def rec(step, loss, **kw):
    return json.dumps({"step": step, "tokens": 100 * step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, **kw}) + "\n"


def test_replayed_steps_keep_the_later_records(tmp_path):
    text = "".join(rec(s, 10.0 - s) for s in range(1, 9))  # the first run, killed after step 8
    text += json.dumps({"step": 5, "tokens": 500, "val_loss": 4.0}) + "\n"
    text += json.dumps({"event": "phase_start", "phase": 1, "step": 6, "seq_len": 64}) + "\n"  # not a curve
    text += "".join(rec(s, 20.0 - s) for s in range(6, 11))  # resumed from step 5: 6..10 again
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 11, "loss": 9.')  # torn: skipped
    m2tb.main([str(tmp_path)])
    acc = accumulator(tmp_path)
    assert curve(acc, "loss") == [(s, 10.0 - s) for s in range(1, 6)] + [(s, 20.0 - s) for s in range(6, 11)]
    assert curve(acc, "val_loss") == [(5, 4.0)]
    assert "seq_len" not in acc.Tags()["scalars"] and "phase" not in acc.Tags()["scalars"]


def test_follow_converts_records_as_they_are_written(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(rec(1, 5.0))
    proc = subprocess.Popen([sys.executable, str(TOOL), str(tmp_path), "--follow", "--interval", "0.1",
                             "--idle-exit", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_for(n):  # the events TensorBoard sees, polled as TensorBoard itself polls
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if (tmp_path / "tensorboard").exists() and list((tmp_path / "tensorboard").glob("events.*")):
                acc = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
                if "loss" in acc.Tags()["scalars"] and len(acc.Scalars("loss")) >= n:
                    return curve(acc, "loss")
            time.sleep(0.1)
        pytest.fail(f"the follower did not convert {n} records within 20 s")

    try:
        assert wait_for(1) == [(1, 5.0)]
        with metrics.open("a") as f:
            f.write(rec(2, 4.0) + rec(3, 3.0)[:10])  # step 3 torn: not converted yet
            f.flush()
            assert wait_for(2) == [(1, 5.0), (2, 4.0)]
            f.write(rec(3, 3.0)[10:])
        assert wait_for(3) == [(1, 5.0), (2, 4.0), (3, 3.0)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_without_tensorboard_it_names_the_venv(tmp_path):
    res = subprocess.run([sys.executable, "-S", str(TOOL), str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 1 and ".venv/bin/python tools/metrics_to_tensorboard.py" in res.stderr, res.stderr


def wandb_history(run_dir):
    """The history rows of the offline W&B run under run_dir, read from its .wandb file: a 7-byte
    header (":W&B", magic, version), then LevelDB-log records (crc32c, length, type; 32 KiB
    blocks; FULL = 1, FIRST/MIDDLE/LAST = 2/3/4), each a wandb Record protobuf."""
    import struct
    from wandb.proto import wandb_internal_pb2 as pb
    (path,) = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    data, pos, payload, rows = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        payload += data[pos:pos + n]
        pos += n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(payload)
            payload = b""
            if r.WhichOneof("record_type") == "history":
                rows.append({("/".join(i.nested_key) or i.key): json.loads(i.value_json) for i in r.history.item})
    return rows


def test_wandb_offline_gets_the_same_scalars(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    text = "".join(rec(s, 10.0 - s, expert_entropy=[0.5, 0.25]) for s in range(1, 5))
    text += json.dumps({"step": 4, "tokens": 400, "val_loss": 4.5}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(text)
    m2tb.main([str(tmp_path), "--wandb", "zaya-test"])
    rows = wandb_history(tmp_path)
    assert [r["_step"] for r in rows] == [1, 2, 3, 4]
    assert [r["loss"] for r in rows] == [9.0, 8.0, 7.0, 6.0]
    assert rows[-1]["val_loss"] == 4.5 and rows[0]["expert_entropy/layer_1"] == 0.25
