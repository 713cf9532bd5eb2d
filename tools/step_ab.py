#!/usr/bin/env python3
"""A/B whole training steps of the demo model on a machine whose speed drifts.

Runs `zaya --threads T bench step --init-config CFG --seed 1 --steps S --batch 8 --seq 256` for
each variant in turn (the order reversed every other round), ROUNDS times, and prints per variant
the median step, the median GEMM time, and the median of the per-round ratios first/this (> 1:
this variant is faster than the first) with their range and how many rounds it won. A variant is
BINARY or BINARY:ENV, ENV being NAME=VALUE[,NAME=VALUE...] added to the environment (a temporary
switch in one build). Only the paired ratio is worth reading on a shared VM.

  tools/step_ab.py /tmp/old/zaya build/cuda/zaya --rounds 14
  tools/step_ab.py build/cuda/zaya build/cuda/zaya:ZAYA_SOME_SWITCH=1 --rounds 12
  tools/step_ab.py OLD NEW --rounds 10 --steps 8 --section experts   # also the parts whose names hold "experts"

--section (repeatable) adds `--sections` to the runs and prints, for every part of the step whose name
holds the text, each variant's median and its paired median difference from the first (this − first).

Run it under scripts/env.sh (library paths, OPENBLAS_CORETYPE) like every zaya run.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_variant(text):
    binary, _, env = text.partition(":")
    extra = dict(item.split("=", 1) for item in env.split(",") if item)
    return binary, extra


def run(binary, extra, args):
    env = dict(os.environ, **extra)
    cmd = [binary, "--threads", str(args.threads), "bench", "step", "--init-config", str(args.config), "--seed", "1",
           "--steps", str(args.steps), "--batch", "8", "--seq", "256"] + (["--sections"] if args.section else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    step = re.search(r"step ([\d.]+) ms", out.stdout)
    gemm = re.search(r"GEMMs ([\d.]+) ms", out.stdout)
    if out.returncode != 0 or not step or not gemm:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    # Rows of the --sections table: "bench:   <part>   <time> ms  <share>%  <GEMMs>  <rest>".
    parts = {m[1].strip(): float(m[2]) for m in re.finditer(r"^bench:   (\S.*?)\s+([\d.]+) ms\s+[\d.]+%", out.stdout, re.M)
             if any(t in m[1] for t in args.section)}
    return float(step[1]), float(gemm[1]), parts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="BINARY or BINARY:NAME=VALUE,...; the first is the reference")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", default=ROOT / "configs" / "demo.toml")
    ap.add_argument("--section", action="append", default=[], help="also compare the step's parts named with this text")
    a = ap.parse_args()
    if len(a.variants) < 2:
        sys.exit("give at least two variants")
    variants = [parse_variant(v) for v in a.variants]
    steps = [[] for _ in variants]
    gemms = [[] for _ in variants]
    parts = [[] for _ in variants]
    for r in range(a.rounds):
        order = range(len(variants)) if r % 2 == 0 else reversed(range(len(variants)))
        for i in order:
            s, g, p = run(*variants[i], a)
            steps[i].append(s)
            gemms[i].append(g)
            parts[i].append(p)
        print(f"round {r + 1}/{a.rounds}: " + "  ".join(f"{s[-1]:.1f}" for s in steps), file=sys.stderr)
    for text, s, g in zip(a.variants, steps, gemms):
        ratios = sorted(x / y for x, y in zip(steps[0], s))
        wins = sum(x / y > 1 for x, y in zip(steps[0], s))
        print(f"{text}: median step {statistics.median(s):.1f} ms, GEMMs {statistics.median(g):.1f} ms, "
              f"first/this paired median {statistics.median(ratios):.3f} [{ratios[0]:.3f}..{ratios[-1]:.3f}], "
              f"faster in {wins} of {len(s)}")
    for name in sorted(parts[0][0]) if a.section else []:
        for text, p in zip(a.variants, parts):
            diffs = sorted(x[name] - y[name] for x, y in zip(p, parts[0]))
            print(f"  {name} | {text}: median {statistics.median(x[name] for x in p):.2f} ms, paired median "
                  f"this - first {statistics.median(diffs):+.2f} ms, faster in {sum(d < 0 for d in diffs)} of {len(p)}")


if __name__ == "__main__":
    main()
