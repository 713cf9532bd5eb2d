#!/usr/bin/env python3
"""The MoE-width trade-off from `zaya size --sweep-experts --sweep-json` files (one per profile).

    zaya size --model configs/zaya1-base.toml --hw mi300x --mbs 4 --sweep-experts --sweep-json mi300x.json
    .venv/bin/python tools/plot_expert_sweep.py mi300x.json h100.json h200.json -o sweep.png

One column per profile; rows: training step time, decode latency at the sweep's first and last batch,
and the serving weights, each against the number of experts, one line per family (fine-grained: fixed
active and total parameters; count: fixed active; coarse: fixed total). The original shape is ringed.
"""
import argparse
import json
import sys

FAMILIES = {"fine-grained": ("tab:blue", "o"), "count": ("tab:orange", "s"), "coarse": ("tab:green", "^")}


def read(path):
    try:
        j = json.load(open(path))
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{path}: {e}")
    if "rows" not in j or not j["rows"]:
        sys.exit(f"{path}: no sweep rows (expected `zaya size --sweep-experts --sweep-json` output)")
    return j


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", help="--sweep-json files")
    ap.add_argument("-o", "--out", default="expert_sweep.png")
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [read(p) for p in a.sweeps]
    batches = data[0]["decode_batches"]
    metrics = [
        ("training step (s)", lambda r: r["train_step_s"]),
        (f"decode latency, batch {batches[0]} (ms)", lambda r: 1e3 * r["decode"][0]["step_s"]),
        (f"decode latency, batch {batches[-1]} (ms)", lambda r: 1e3 * r["decode"][-1]["step_s"]),
        ("serving weights (GiB)", lambda r: r["serve_weight_bytes"] / 2**30),
    ]
    fig, axes = plt.subplots(len(metrics), len(data), figsize=(4.2 * len(data), 2.8 * len(metrics)), squeeze=False)
    for col, j in enumerate(data):
        for row, (label, f) in enumerate(metrics):
            ax = axes[row][col]
            for fam, (color, marker) in FAMILIES.items():
                rows = sorted((r for r in j["rows"] if r["family"] == fam or (fam != "fine-grained" and r["original"])),
                              key=lambda r: r["experts"])
                if not rows:
                    continue
                ax.plot([r["experts"] for r in rows], [f(r) for r in rows], marker=marker, color=color, label=fam)
                for r in rows:
                    if fam == "fine-grained" and row == 0:
                        ax.annotate(f"{r['experts']}x{r['width']} top-{r['top_k']}", (r["experts"], f(r)), fontsize=6,
                                    xytext=(3, 3), textcoords="offset points")
            orig = next(r for r in j["rows"] if r["original"])
            ax.scatter([orig["experts"]], [f(orig)], s=160, facecolors="none", edgecolors="black", zorder=5)
            ax.set_xscale("log", base=2)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3)
            if row == 0:
                kind = "measured GEMM table" if j["gemm_table"] else "datasheet rate"
                ax.set_title(f"{j['hw']} ({kind})", fontsize=9)
            if row == len(metrics) - 1:
                ax.set_xlabel("experts per layer")
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
