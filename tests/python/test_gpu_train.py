"""benchmarks/gpu_train.py, the GPU benchmark against transformers, in its CPU smoke mode: tiny
shapes, zaya on the emulated device (ZAYA_EMULATE_CUDA=1: the device path of `zaya bench step`,
its device-memory line and parts, with the CPU kernels), transformers on the CPU, torch.compile
with dynamo's eager backend. Checks that every field of the result and the tables is there and
consistent; no timing is asserted (these are a loaded CPU's numbers, meaningless as results).

Run: ZAYA_BINARY=build/cuda/zaya .venv/bin/python -m pytest tests/python/test_gpu_train.py
"""
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_train.py"
ZAYA = os.environ.get("ZAYA_BINARY", str(ROOT / "build" / "cuda" / "zaya"))

# Looked up, not imported: importing transformers here would cost the test seconds the
# benchmark's own child processes spend again.
if importlib.util.find_spec("matplotlib") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("needs matplotlib and transformers (the venv of scripts/setup.sh)", allow_module_level=True)
TRANSFORMERS = importlib.metadata.version("transformers")
if not (Path(importlib.util.find_spec("transformers").origin).parent / "models" / "zaya").is_dir():
    pytest.skip(f"transformers {TRANSFORMERS} has no ZayaForCausalLM", allow_module_level=True)
if not Path(ZAYA).exists():
    pytest.skip(f"no zaya binary at {ZAYA} (set ZAYA_BINARY)", allow_module_level=True)


def run(args, tmp_path):
    env = dict(os.environ, ZAYA_EMULATE_CUDA="1", OMP_WAIT_POLICY="PASSIVE", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--zaya", ZAYA, "--device", "cpu",
                        "--zaya-device", "cuda", "--layers", "1", "--out", str(tmp_path)] + args,
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_smoke_run_reports_every_field(tmp_path):
    out = run([], tmp_path)
    res = json.loads((tmp_path / "gpu_train.json").read_text())
    z, size = res["zaya"], res["size"]
    assert res["config"]["num_hidden_layers"] == 1 and res["config"]["hidden_size"] == 128
    assert res["micro_batch"] == 2 and res["seq"] == 64 and res["peak_tflops"] == 989.0
    assert res["env"]["zaya_commit"] and res["env"]["zaya_version"]
    assert z["precision"] == "bf16 (fp32 master weights), optimizer AdamW"
    for key in ("step_ms", "forward_ms", "backward_ms", "tokens_per_s", "flops_per_token", "peak_memory_mib"):
        assert z[key] > 0, key
    assert z["optimizer_ms"] >= 0
    # The step is its three phases (each printed to 0.01 ms); tokens/s is the batch over the step
    # (the step printed to 0.01 ms, so up to half a unit of it off).
    assert abs(z["forward_ms"] + z["backward_ms"] + z["optimizer_ms"] - z["step_ms"]) <= 0.02
    assert abs(z["tokens_per_s"] * z["step_ms"] / 1e3 - 2 * 64) <= 2 * 64 * 0.006 / z["step_ms"] + 0.01
    assert z["peak_memory_kind"] == "zaya's tensors on the device"
    # bench step's FLOPs per token are zaya size's (which prints 3 decimals of GFLOP).
    assert abs(size["flops_per_token"] - z["flops_per_token"]) <= 0.5e6
    assert size["parameters"] > 0 and size["predicted_step_s"] > 0 and size["memory_gib"] >= 0
    assert abs(size["measured_over_predicted"] - z["step_ms"] / 1e3 / size["predicted_step_s"]) <= 0.005 + \
        0.01 * size["measured_over_predicted"]
    # The parts of the step: every forward and backward part, then the update; shares add to 1
    # (each printed to 0.1%).
    parts = [r["part"] for r in z["sections"]]
    assert parts[0].startswith("forward: ") and parts[-1] == "optimizer: update and balancer"
    assert any(p.startswith("backward: experts") for p in parts)
    assert abs(sum(r["share"] for r in z["sections"]) - 1) <= 0.0005 * len(parts) + 1e-9
    for mode in ("hf_eager", "hf_compile"):
        h = res[mode]
        assert "error" not in h, h
        assert h["tokens_per_s"] > 0 and h["step_ms"] > 0 and h["peak_memory_mib"] > 0
        assert h["parameters"] == size["parameters"], mode  # the same model on both sides
        assert h["transformers"] == TRANSFORMERS
    assert res["hf_compile"]["compile_backend"] == "eager"
    goals = {g["goal"]: g for g in res["goals"]}
    assert len(goals) == 3
    eager = goals["zaya / transformers eager (tokens/s)"]
    assert eager["value"] == pytest.approx(z["tokens_per_s"] / res["hf_eager"]["tokens_per_s"])
    assert eager["met"] == ("yes" if eager["value"] >= 3 else "no")
    mfu = goals["MFU"]["value"]
    assert mfu == pytest.approx(z["tokens_per_s"] * z["flops_per_token"] / 989e12)

    md = (tmp_path / "gpu_train.md").read_text()
    for row in ("| tokens/s |", "| MFU |", "| peak memory (allocator) |", "| device memory used (nvidia-smi) |",
                "| warm-up / compilation |", "| goal | target | reached | met |", "| part | ms per step | share |"):
        assert row in md, row
    assert (tmp_path / "gpu_train_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The result line closes the output, and --replot rebuilds the same tables from a log holding it.
    last = out.strip().splitlines()[-1]
    assert last.startswith("gpu_train: result ") and json.loads(last[len("gpu_train: result "):]) == res
    log = tmp_path / "log.txt"
    log.write_text("other output\n" + out + "more output\n")
    again = tmp_path / "again"
    p = subprocess.run([sys.executable, str(SCRIPT), "--replot", str(log), "--out", str(again)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (again / "gpu_train.md").read_text() == md
    assert (again / "gpu_train_step.png").exists()


def test_a_failed_transformers_run_is_reported_not_fatal(tmp_path):
    # A timeout too short for any model stands in for an out-of-memory or a compile that hangs.
    run(["--hf-timeout", "0.01", "--no-compile", "--sections-steps", "0", "--no-plot"], tmp_path)
    res = json.loads((tmp_path / "gpu_train.json").read_text())
    assert "within --hf-timeout" in res["hf_eager"]["error"]
    assert res["hf_compile"]["error"] == "skipped (--no-compile)"
    assert [g["met"] for g in res["goals"]][1:] == ["n/a", "n/a"]
    md = (tmp_path / "gpu_train.md").read_text()
    assert "| tokens/s |" in md and "failed" in md
    assert not (tmp_path / "gpu_train_step.png").exists()
