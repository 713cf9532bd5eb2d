#!/usr/bin/env python3
"""GEMM throughput versus size from hardware profiles written by `zaya bench gemm --out`.

    .venv/bin/python tools/plot_gemm.py profile.json [more.json ...] -o gemm.png
x: GEMM size 2·M·N·K (log), y: achieved GFLOP/s; squares drawn as a line, other shapes as dots.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("-o", "--out", default="gemm.png")
    ap.add_argument("--title", default="zaya bench gemm")
    a = ap.parse_args()
    fig, ax = plt.subplots(figsize=(8, 5))
    for path in a.profiles:
        with open(path) as f:
            p = json.load(f)
        table = p.get("gemm_table")
        if not table:
            raise SystemExit(f"{path}: no gemm_table (write it with `zaya bench gemm --out`)")
        label = f"{p.get('name', path)} ({p.get('gemm_dtype', '?')})"
        sq = sorted((2 * e["m"] * e["n"] * e["k"], e["flops_per_s"] / 1e9) for e in table if e["m"] == e["n"] == e["k"])
        other = [(2 * e["m"] * e["n"] * e["k"], e["flops_per_s"] / 1e9) for e in table if not e["m"] == e["n"] == e["k"]]
        line = None
        if sq:
            (line,) = ax.plot([x for x, _ in sq], [y for _, y in sq], marker="o", label=label + " squares")
        if other:
            ax.scatter([x for x, _ in other], [y for _, y in other], s=14, alpha=0.6,
                       color=line.get_color() if line else None, label=label + " other shapes")
    ax.set_xscale("log")
    ax.set_xlabel("GEMM size 2·M·N·K (FLOP)")
    ax.set_ylabel("achieved GFLOP/s (median)")
    ax.set_title(a.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
