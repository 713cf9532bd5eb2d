#!/usr/bin/env python3
"""Each model GEMM as a percentage of the library's square GEMM of the nearest FLOP count, from
the console output of `bench_ops_gemm --benchmark_filter=vs_square` (medians when the run used
--benchmark_repetitions, otherwise the single rows); one bar per shape and dtype, the 80% bar drawn.

    .venv/bin/python tools/plot_gemm_vs_square.py docs/results/ops-cpu/gemm-vs-square-0950.txt \
        [more.txt ...] -o gemm-vs-square.png
Several files (e.g. two OpenMP wait policies) give grouped bars, labelled by file name.
"""
import argparse
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROW = re.compile(r"^(gemm(?:_grouped)?_vs_square)/(\S+?)/(f32|bf16)/real_time(_median)?\s.*pct_of_square=([0-9.]+)")


def read(path):
    """{(shape, dtype): pct}, medians preferred over single rows."""
    rows, medians = {}, {}
    for line in Path(path).read_text().splitlines():
        m = ROW.match(line)
        if not m:
            continue
        kind, shape, dtype, median, pct = m.groups()
        key = (("grouped " if kind.startswith("gemm_grouped") else "") + shape, dtype)
        (medians if median else rows)[key] = float(pct)
    out = medians or rows
    if not out:
        raise SystemExit(f"{path}: no vs_square rows (run bench_ops_gemm --benchmark_filter=vs_square)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("-o", "--out", default="gemm-vs-square.png")
    a = ap.parse_args()
    runs = [(Path(p).stem, read(p)) for p in a.runs]
    keys = sorted({k for _, r in runs for k in r}, key=lambda k: (k[1], k[0].startswith("grouped"), k[0]))
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(runs)
    for i, (name, r) in enumerate(runs):
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(keys))]
        ax.bar(xs, [r.get(k, 0.0) for k in keys], width, label=name)
    ax.axhline(80, color="black", linestyle="--", linewidth=1, label="bar: 80% of the square")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{s} ({d})" for s, d in keys], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("% of the square GEMM's rate (paired)")
    ax.set_title("Model GEMMs vs oneDNN's square GEMM of similar FLOPs, alternated call by call")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
