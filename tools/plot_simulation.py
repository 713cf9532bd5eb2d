#!/usr/bin/env python3
"""Plots the text output of `zaya simulate`: busbw versus size per algorithm (one panel per
collective) and, when the run had --model, ZeRO-1 scaling efficiency versus GPUs.

    zaya simulate --nodes 16 --model configs/zaya1-base.toml > sim.txt
    .venv/bin/python tools/plot_simulation.py sim.txt -o sim.png
"""
import argparse
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ALGOS = ["ring", "tree", "hierarchical"]


def parse(path):
    sweeps, scaling, cur, in_scaling = {}, [], None, False
    for line in open(path):
        m = re.match(r"# (\w+) on (\d+) node", line)
        if m:
            cur, in_scaling = m.group(1), False
            sweeps[cur] = {"title": line[2:].strip(), "rows": []}
            continue
        if line.startswith("# ZeRO-1"):
            in_scaling, cur = True, None
            continue
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        if in_scaling:
            scaling.append((int(f[0]), float(f[6].rstrip("%")), float(f[8].rstrip("%"))))
        elif cur:
            size = float(f[0])
            bw = [None if f[3 + 2 * i] == "n/a" else float(f[3 + 2 * i]) for i in range(3)]
            sweeps[cur]["rows"].append((size, bw))
    return sweeps, scaling


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", help="text written by zaya simulate")
    ap.add_argument("-o", "--out", default="simulation.png")
    a = ap.parse_args()
    sweeps, scaling = parse(a.output)
    if not sweeps:
        raise SystemExit(f"{a.output}: no simulate tables found")
    panels = len(sweeps) + (1 if scaling else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2), squeeze=False)
    for ax, (op, s) in zip(axes[0], sweeps.items()):
        for i, algo in enumerate(ALGOS):
            pts = [(size, bw[i]) for size, bw in s["rows"] if bw[i] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=algo)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("predicted busbw (GB/s)")
        ax.set_title(op, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    if scaling:
        ax = axes[0][-1]
        g = [r[0] for r in scaling]
        ax.plot(g, [r[1] for r in scaling], marker="o", label="no overlap")
        ax.plot(g, [r[2] for r in scaling], marker="o", label="with overlap")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 105)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_title("ZeRO-1 data parallel", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
