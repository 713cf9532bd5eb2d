#!/usr/bin/env python3
"""Goodput against the checkpoint interval, from `zaya simulate --goodput` outputs (one curve each).

    zaya simulate --goodput --gpus 1024 > g1024.txt
    .venv/bin/python tools/plot_goodput.py g1024.txt [more.txt ...] --labels "1,024 GPUs" ... -o goodput.png
"""
import argparse
import re
import sys


def read(path):
    header, xs, ys, young = "", [], [], None
    for line in open(path):
        if line.startswith("# goodput:"):
            header = line[len("# goodput:"):].strip()
        m = re.match(r"\s+([0-9.]+)\s+([0-9.]+)%", line)
        if m:
            xs.append(float(m.group(1)))
            ys.append(float(m.group(2)))
        m = re.search(r"Young's interval .*?: ([0-9.]+) min", line)
        if m:
            young = float(m.group(1))
    if not xs:
        sys.exit(f"{path}: no goodput table (expected `zaya simulate --goodput` output)")
    return header, xs, ys, young


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--labels", nargs="*")
    ap.add_argument("-o", "--out", default="goodput.png")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_goodput: needs matplotlib; run it with the project's venv: .venv/bin/python tools/plot_goodput.py ...")
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, path in enumerate(args.files):
        header, xs, ys, young = read(path)
        label = args.labels[i] if args.labels and i < len(args.labels) else header
        (line,) = ax.plot(xs, ys, marker="o", label=label)
        if young:
            ax.axvline(young, color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes); dotted: Young's sqrt(2C/lambda)")
    ax.set_ylabel("goodput (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_goodput: {args.out}")


if __name__ == "__main__":
    main()
