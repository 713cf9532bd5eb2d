#!/usr/bin/env python3
"""A/B two builds of a Google Benchmark binary on a machine whose speed drifts.

Runs OLD and NEW in turn (OLD first in even rounds, NEW first in odd ones), ROUNDS times, each with
--benchmark_filter=FILTER, and prints per benchmark the median time of each and the median of the
per-round ratios old/new (> 1: NEW is faster) with their range. Only the paired ratio is worth
reading on a shared VM: two runs minutes apart can differ by 30% with the same code.

  tools/bench_ab.py OLD_BINARY NEW_BINARY FILTER [--rounds 10] [--min-time 0.2]

Example (the previous commit built in a worktree):
  git worktree add /tmp/old HEAD~1 && cmake -S /tmp/old -B /tmp/old/build -G Ninja -DZAYA_CUDA=OFF \\
      -DCMAKE_BUILD_TYPE=Release && ninja -C /tmp/old/build bench_ops_gemm
  tools/bench_ab.py /tmp/old/build/benchmarks/bench_ops_gemm build/cuda/benchmarks/bench_ops_gemm \\
      'gemm_grouped/demo/.*/bf16'
"""
import argparse
import collections
import re
import statistics
import subprocess
import sys

UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def run(binary, flt, min_time):
    out = subprocess.run([binary, f"--benchmark_filter={flt}", f"--benchmark_min_time={min_time}"],
                         capture_output=True, text=True, check=True).stdout
    times = {}
    for line in out.splitlines():
        m = re.match(r"(\S+)\s+([\d.]+) (ns|us|ms|s)\s", line)
        if m:
            times[m[1]] = float(m[2]) * UNIT_US[m[3]]
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("filter")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--min-time", default="0.2")
    a = ap.parse_args()
    res = {a.old: collections.defaultdict(list), a.new: collections.defaultdict(list)}
    for r in range(a.rounds):
        for b in (a.old, a.new) if r % 2 == 0 else (a.new, a.old):
            for name, t in run(b, a.filter, a.min_time).items():
                res[b][name].append(t)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    if not res[a.old]:
        sys.exit(f"no benchmark matched {a.filter!r}")
    for name, old in res[a.old].items():
        new = res[a.new].get(name, [])
        if len(new) != len(old):
            print(f"{name}: ran {len(old)} times in OLD and {len(new)} in NEW; skipped")
            continue
        ratios = sorted(o / n for o, n in zip(old, new))
        print(f"{name:58s} old {statistics.median(old):10.1f} us  new {statistics.median(new):10.1f} us  "
              f"old/new paired median {statistics.median(ratios):.3f} [{ratios[0]:.2f}..{ratios[-1]:.2f}]")


if __name__ == "__main__":
    main()
