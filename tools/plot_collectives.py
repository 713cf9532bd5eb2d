#!/usr/bin/env python3
"""Plot bus bandwidth versus message size from `zaya bench collectives --csv` files.

One line per (collective, rank count); out-of-place busbw by default (--in-place for the other).

    python tools/plot_collectives.py docs/results/cluster-cpu/collectives-np*.csv \
        -o docs/results/cluster-cpu-collectives.png --title "2-core VM, OpenMPI 4.1, float"
"""
import argparse
import csv
import sys
from collections import defaultdict


def read_rows(paths):
    series = defaultdict(list)  # (op, ranks) -> [(size, busbw)]
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            need = {"op", "ranks", "size_bytes", "oop_busbw_gbs", "ip_busbw_gbs"}
            missing = need - set(reader.fieldnames or [])
            if missing:
                sys.exit(f"{path}: not a zaya collectives CSV (missing columns {sorted(missing)})")
            for row in reader:
                series[(row["op"], int(row["ranks"]))].append(
                    (int(row["size_bytes"]), float(row["oop_busbw_gbs"]), float(row["ip_busbw_gbs"]))
                )
    return series


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="CSV files written by zaya bench collectives --csv")
    ap.add_argument("-o", "--output", required=True, help="output image (PNG, SVG, PDF)")
    ap.add_argument("--title", default="zaya bench collectives")
    ap.add_argument("--in-place", action="store_true", help="plot in-place busbw instead of out-of-place")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    series = read_rows(args.csv)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = ["-", "--", ":", "-."]
    ranks_seen = sorted({r for _, r in series})
    for (op, ranks), pts in sorted(series.items()):
        pts = sorted(p for p in pts if p[0] > 0)  # size 0 has no bandwidth to show
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ys = [p[2] if args.in_place else p[1] for p in pts]
        ax.plot(xs, ys, styles[ranks_seen.index(ranks) % len(styles)], marker="o", markersize=3,
                label=f"{op}, {ranks} ranks")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes; the whole array for reduce_scatter/all_gather/all_to_all)")
    ax.set_ylabel(f"bus bandwidth, {'in' if args.in_place else 'out-of'}-place (GB/s)")
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
