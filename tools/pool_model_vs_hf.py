#!/usr/bin/env python3
"""Pool the rounds of several benchmarks/model_vs_hf.py runs into one verdict on issue #4's 2× bar.

  tools/pool_model_vs_hf.py docs/results/model-cpu/model_vs_hf-2026-11-26-s19-*.txt

Prints, over every kept round of the files (rounds the script left out for hypervisor steal stay
out), the median of the zaya/transformers fp32 ratio, of the bf16-GEMM ratio and of the GEMM floor,
how many rounds reached 2×, and a 95% interval for each median. Rounds of one run share a few
minutes of the machine's state, so they are not independent draws: the interval resamples whole
runs (a block bootstrap, 10 000 resamples, fixed seed), which is wider and more honest than
resampling rounds. A bar is met with confidence when the interval's lower end is at or above it.
"""
import argparse
import random
import re
import statistics
import sys
from pathlib import Path

ROUND = re.compile(r"ratio zaya fp32 / transformers fp32 \(tokens/s\): ([\d.]+)x; bf16 GEMMs: ([\d.]+)x; "
                   r"GEMM floor \(transformers step / zaya GEMM time\): ([\d.]+)x(.*)")


def kept_rounds(path):
    """[(fp32, bf16, floor)] of one output file's rounds that entered its median."""
    return [(float(m[1]), float(m[2]), float(m[3])) for m in ROUND.finditer(Path(path).read_text())
            if "[left out of the median" not in m[4]]


def block_bootstrap(runs, column, resamples, rng):
    """2.5th and 97.5th percentiles of the pooled median over resamples of whole runs."""
    medians = []
    for _ in range(resamples):
        pick = [rng.choice(runs) for _ in runs]
        medians.append(statistics.median(r[column] for run in pick for r in run))
    medians.sort()
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bar", type=float, default=2.0)
    ap.add_argument("--resamples", type=int, default=10000)
    args = ap.parse_args()
    runs = [r for r in (kept_rounds(f) for f in args.files) if r]
    if not runs:
        sys.exit("no kept rounds in " + " ".join(args.files))
    pooled = [r for run in runs for r in run]
    rng = random.Random(1)
    print(f"{len(pooled)} kept rounds in {len(runs)} runs")
    intervals = []
    for column, name in enumerate(("zaya fp32 / transformers fp32", "zaya bf16 GEMMs / transformers fp32",
                                   "GEMM floor")):
        values = [r[column] for r in pooled]
        lo, hi = block_bootstrap(runs, column, args.resamples, rng)
        intervals.append((lo, hi))
        at_bar = sum(v >= args.bar for v in values)
        print(f"{name:36s} median {statistics.median(values):.2f}x  95% interval {lo:.2f}-{hi:.2f}x  "
              f"rounds at {args.bar:g}x or above: {at_bar} of {len(values)}  (range {min(values):.2f}-{max(values):.2f})")
    lo = intervals[0][0]  # the fp32 ratio's
    verdict = "met" if lo >= args.bar else "not met with confidence"
    print(f"bar {args.bar:g}x in fp32: {verdict} (the interval's lower end is {lo:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
