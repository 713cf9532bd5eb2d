#!/usr/bin/env python3
"""CPU time a program's OpenMP threads still use after its training step has returned (libgomp's spin
before sleeping), the reason for benchmarks/model_vs_hf.py's --settle-ms.

  .venv/bin/python tools/omp_spin_probe.py --threads 2      (after source scripts/env.sh)

After each step of a resident `zaya bench step --paced` process (its CPU time read from
/proc/PID/stat, in clock ticks: 10 ms here) and of a kept transformers model (this process's CPU
time, including this loop's own small share), prints the CPU milliseconds used 5, 10, 20, 50, 100
and 200 ms after the step returned. Result: docs/results/model-cpu-sessions.md, session 21.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import model_vs_hf as mv  # noqa: E402

MARKS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)


def proc_cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def after_step(step, cpu_s):
    step()
    t0, c0 = time.perf_counter(), cpu_s()
    marks = []
    for mark in MARKS_S:
        while time.perf_counter() - t0 < mark:
            time.sleep(0.001)
        marks.append(f"{mark * 1e3:.0f} ms: {(cpu_s() - c0) * 1e3:.0f}")
    return "  ".join(marks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zaya", default=os.environ.get("ZAYA_BINARY", str(mv.ROOT / "build/cuda/zaya")))
    ap.add_argument("--config", default=str(mv.ROOT / "configs/demo.toml"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    cfg = mv.model_config(a.config)
    zaya = mv.PacedZaya(a.zaya, cfg, a.threads, 8, 256, a.steps)
    for _ in range(a.steps):
        print("zaya: CPU ms after its step returned:", after_step(zaya.step, lambda: proc_cpu_s(zaya.p.pid)))
    zaya.close()
    hf = mv.HfModel(cfg, a.threads, 8, 256, "sdpa")
    hf.step()
    for _ in range(a.steps):
        print("transformers: CPU ms after its step returned:", after_step(hf.step, time.process_time))
    return 0


if __name__ == "__main__":
    sys.exit(main())
