#!/usr/bin/env python3
"""Pool the rounds of several benchmarks/model_vs_hf.py runs into one verdict on issue #4's 2× bar.

  tools/pool_model_vs_hf.py run1.txt run2.txt ...     (outputs of benchmarks/model_vs_hf.sh)

Files from the two pairings of benchmarks/model_vs_hf.py (single steps alternating, the default
and the older blocks) should be pooled apart: it warns when they are mixed.

Prints, over every kept round of the files (rounds the script left out for hypervisor steal stay
out), the median of the zaya/transformers fp32 ratio, of the bf16-GEMM ratio and of the GEMM floor,
how many rounds reached 2×, and a 95% interval for each median. Rounds of one run share a few
minutes of the machine's state, so they are not independent draws: the interval resamples whole
runs (a block bootstrap, 10 000 resamples, fixed seed), which is wider and more honest than
resampling rounds. A bar is met with confidence when the interval's lower end is at or above it.

--by-probe also splits the kept rounds that carry a machine probe (benchmarks/model_vs_hf.py prints
one per round: a torch fp32 matmul timed just before the round, measured by neither
program) into quarters by the probe, with each quarter's median ratio and steps: whether the ratio
depends on the machine's speed at the time. (Splitting by zaya's own GEMM rate would not do: it is
part of zaya's step, so its fast rounds are zaya's lucky ones.)
"""
import argparse
import random
import re
import statistics
import sys
from pathlib import Path

# A round with its machine probe, three step times and the verdict line's tail.
PROBED_ROUND = re.compile(r"round \d+\n  machine probe .*?: ([\d.]+) GFLOP/s\n  zaya fp32 .*?step\s+([\d.]+) ms.*?\n"
                          r"  zaya bf16 GEMMs .*?step\s+([\d.]+) ms.*?\n  transformers fp32 .*?step\s+([\d.]+) ms.*?\n"
                          r".*?\n  ratio zaya fp32 .*?GEMM floor.*?x(.*)")
ROUND = re.compile(r"ratio zaya fp32 / transformers fp32 \(tokens/s\): ([\d.]+)x; bf16 GEMMs: ([\d.]+)x; "
                   r"GEMM floor \(transformers step / zaya GEMM time\): ([\d.]+)x(.*)")


def kept_rounds(text):
    """[(fp32, bf16, floor)] of one output file's rounds that entered its median."""
    return [(float(m[1]), float(m[2]), float(m[3])) for m in ROUND.finditer(text)
            if "[left out of the median" not in m[4]]


def print_by_probe(texts, bar):
    """The kept rounds with a machine probe, in quarters by it: median fp32 ratio and steps of each."""
    rows = []
    for text in texts:
        for m in PROBED_ROUND.finditer(text):
            if "[left out of the median" not in m[5]:
                rows.append(tuple(float(m[i]) for i in (1, 2, 3, 4)))  # probe, zaya, zaya bf16, transformers
    if len(rows) < 4:
        print(f"by machine probe: {len(rows)} probed rounds, too few to split")
        return
    rows.sort()
    print("by machine probe (torch fp32 matmul before the round), quarters of the probed rounds:")
    for q in range(4):
        part = rows[q * len(rows) // 4:(q + 1) * len(rows) // 4]
        ratios = [h / z for _, z, _, h in part]
        print(f"  probe {part[0][0]:5.1f}-{part[-1][0]:5.1f} GFLOP/s  {len(part):3d} rounds  median fp32 ratio "
              f"{statistics.median(ratios):.2f}x ({sum(r >= bar for r in ratios)} at {bar:g}x or above)  steps: zaya "
              f"{statistics.median(r[1] for r in part):.0f} ms, bf16 GEMMs {statistics.median(r[2] for r in part):.0f} ms, "
              f"transformers {statistics.median(r[3] for r in part):.0f} ms")


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
    ap.add_argument("--by-probe", action="store_true", help="also split the probed rounds by the machine probe")
    args = ap.parse_args()
    texts = [Path(f).read_text() for f in args.files]
    runs = [r for r in (kept_rounds(t) for t in texts) if r]
    if not runs:
        sys.exit("no kept rounds in " + " ".join(args.files))
    # The default pairing alternates single steps of resident programs (a "pairing:" line); the block
    # pairing builds a new transformers model every round, whose steps run ~5-10% slower than a kept
    # model's (docs/results/model-cpu.md, "How it is measured"). Pooling both mixes two biases.
    paired = sum("\npairing: single steps" in t for t in texts)
    if 0 < paired < len(args.files):
        print(f"warning: {paired} of {len(args.files)} files alternate single steps (--pairing step) and the "
              f"rest time blocks (--pairing block); their ratios differ systematically: pool them apart")
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
    if args.by_probe:
        print_by_probe(texts, args.bar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
