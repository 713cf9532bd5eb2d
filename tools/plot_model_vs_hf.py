#!/usr/bin/env python3
"""Plot benchmarks/model_vs_hf.py runs: each round's zaya/transformers fp32 ratio, run by run.

  tools/plot_model_vs_hf.py run1.txt run2.txt ... -o ratios.png     (outputs of benchmarks/model_vs_hf.sh)

One column per output file, in the order given (the files' names sort by start time). Dots are the
rounds, the bar is the run's median, the dashed line the 2× bar of issue #4. Rounds the script left
out of its median for hypervisor steal (marked "[left out of the median") are grey
crosses and do not enter the bar; a run with no other rounds has no bar. A file holding only a
summary and no per-round lines is skipped with a message.
"""
import argparse
import re
import statistics
import sys
from pathlib import Path


def rounds_of(path):
    """[(ratio, kept)] for every round of one output file."""
    text = Path(path).read_text()
    return [(float(m[1]), "[left out of the median" not in m[2])
            for m in re.finditer(r"ratio zaya fp32 / transformers fp32 \(tokens/s\): ([\d.]+)x(.*)", text)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--change-before", action="append", default=[], metavar="LABEL:TEXT",
                    help="a dotted line before the run labelled LABEL (its start time), captioned TEXT: "
                         "where the code changed between runs")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for f in args.files:
        r = rounds_of(f)
        if not r:
            print(f"skipped {f}: no per-round ratio lines", file=sys.stderr)
            continue
        label = re.sub(r"^model_vs_hf-\d{4}-\d\d-\d\d-?", "", Path(f).stem) or Path(f).stem
        runs.append((label, r))
    if not runs:
        sys.exit("no runs to plot")
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(runs) + 2), 4))
    for x, (label, r) in enumerate(runs):
        kept = [v for v, k in r if k]
        left = [v for v, k in r if not k]
        ax.scatter([x] * len(kept), kept, s=14, color="tab:blue", alpha=0.6, zorder=2)
        if left:
            ax.scatter([x] * len(left), left, s=14, marker="x", color="grey", alpha=0.7, zorder=2)
        if kept:
            ax.hlines(statistics.median(kept), x - 0.3, x + 0.3, color="tab:red", linewidth=2, zorder=3)
    labels = [label for label, _ in runs]
    for mark in args.change_before:
        where, _, text = mark.partition(":")
        if where not in labels:
            sys.exit(f"--change-before: no run labelled {where} (labels: {', '.join(labels)})")
        x = labels.index(where) - 0.5
        ax.axvline(x, color="tab:green", linestyle=":", linewidth=1.5)
        ax.annotate(text, (x, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3),
                    textcoords="offset points", va="top", fontsize=8, color="tab:green")
    ax.axhline(2.0, color="black", linestyle="--", linewidth=1, label="bar: 2×")
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([label for label, _ in runs], rotation=60, ha="right", fontsize=8)
    ax.set_xlabel("run (start time, UTC)")
    ax.set_ylabel("zaya / transformers, fp32 tokens/s")
    ax.set_title("Training step, demo shapes, 2 threads\nrounds (dots; x: left out for steal) and run medians",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out} ({len(runs)} runs)")


if __name__ == "__main__":
    main()
