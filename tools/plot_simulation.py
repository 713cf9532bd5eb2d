#!/usr/bin/env python3
"""Plots the text output of `zaya simulate`.

- Collective sweeps: busbw versus size per algorithm (one panel per collective) and, when the run
  had --model, ZeRO-1 weak-scaling efficiency versus GPUs.
- Data-parallel tables (--model ... --global-batch N): scaling efficiency versus GPUs, one line per
  table (several files, e.g. one per --cluster preset), and the first table's step split into
  compute, exposed reduce-scatter, exposed all-gather and optimizer.

    zaya simulate --nodes 16 --model configs/zaya1-base.toml > sim.txt
    .venv/bin/python tools/plot_simulation.py sim.txt -o sim.png
    zaya simulate --cluster mi300x-pollara --op none --model configs/zaya1-base.toml --global-batch 4096 > a.txt
    zaya simulate --cluster h100-ib --op none --model configs/zaya1-base.toml --global-batch 4096 > b.txt
    .venv/bin/python tools/plot_simulation.py a.txt b.txt --labels "MI300X" "H100" -o dp.png
"""
import argparse
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ALGOS = ["ring", "tree", "hierarchical"]


def parse(path):
    """Returns (sweeps, weak-scaling rows, data-parallel tables)."""
    sweeps, scaling, dp, cur, in_scaling = {}, [], [], None, False
    for line in open(path):
        m = re.match(r"# (\w+) on (\d+) node", line)
        if m:
            cur, in_scaling = m.group(1), False
            sweeps[cur] = {"title": line[2:].strip(), "rows": []}
            continue
        if line.startswith("# ZeRO-1"):
            in_scaling, cur = True, None
            continue
        m = re.match(r"# data parallel as the trainer runs it: .* on (\S+) \(", line)
        if m:
            in_scaling, cur = "dp", None
            dp.append({"cluster": m.group(1), "rows": []})
            continue
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        if in_scaling == "dp":
            dp[-1]["rows"].append({
                "gpus": int(f[0]), "compute": float(f[3]), "rs_exposed": float(f[6]),
                "ag_exposed": float(f[7]), "optim": float(f[8]), "step": float(f[9]),
                "eff": float(f[11].rstrip("%")), "compute_frac": float(f[12].rstrip("%"))})
        elif in_scaling:
            scaling.append((int(f[0]), float(f[6].rstrip("%")), float(f[8].rstrip("%"))))
        elif cur:
            size = float(f[0])
            bw = [None if f[3 + 2 * i] == "n/a" else float(f[3 + 2 * i]) for i in range(3)]
            sweeps[cur]["rows"].append((size, bw))
    return sweeps, scaling, dp


def plot_data_parallel(tables, labels, out):
    """Efficiency versus GPUs for every table; the first table's step split versus GPUs."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    ax = axes[0]
    for t, label in zip(tables, labels):
        g = [r["gpus"] for r in t["rows"]]
        ax.plot(g, [r["eff"] for r in t["rows"]], marker="o", label=label)
    ax.axhline(90, color="gray", linestyle="--", linewidth=1, label="goal: 90%")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 105)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("per-GPU throughput vs the smallest row (%)")
    ax.set_title("scaling efficiency, global batch fixed", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    rows = tables[0]["rows"]
    g = [r["gpus"] for r in rows]
    parts = [("compute", "compute"), ("rs_exposed", "reduce-scatter after backward"),
             ("ag_exposed", "parameter all-gather"), ("optim", "optimizer step")]
    ax.stackplot(g, *[[100 * r[k] / r["step"] for r in rows] for k, _ in parts], labels=[n for _, n in parts])
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 100)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("share of the step (%)")
    ax.set_title(f"where the step goes: {labels[0]}", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outputs", nargs="+", help="text written by zaya simulate (several for data-parallel tables)")
    ap.add_argument("--labels", nargs="+", help="legend names of the data-parallel tables, in order")
    ap.add_argument("-o", "--out", default="simulation.png")
    a = ap.parse_args()
    parsed = [parse(p) for p in a.outputs]
    tables = [t for _, _, dp in parsed for t in dp]
    if tables:
        labels = a.labels or [t["cluster"] for t in tables]
        if len(labels) != len(tables):
            raise SystemExit(f"--labels: {len(labels)} names for {len(tables)} data-parallel tables")
        plot_data_parallel(tables, labels, a.out)
        return
    if len(a.outputs) > 1:
        raise SystemExit("several files plot only data-parallel tables (--global-batch); none found")
    sweeps, scaling, _ = parsed[0]
    if not sweeps:
        raise SystemExit(f"{a.outputs[0]}: no simulate tables found")
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
