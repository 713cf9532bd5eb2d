#!/usr/bin/env python3
"""Plot a zaya training run's metrics.jsonl: loss, learning rate, gradient norm, expert load.

    tools/plot_metrics.py RUN_DIR [RUN_DIR ...] [--out DIR] [--labels A,B] [--baseline NATS]

Writes loss.png, lr.png, grad_norm.png and expert_load.png into --out (default: the first
RUN_DIR). With several runs, each figure overlays them (expert load: the first run only). Prints
each run's per-layer expert-load entropy averaged over --window steps (default 50).
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
except ImportError:  # the system Python: name the interpreter that has it
    sys.exit("plot_metrics: matplotlib is missing; run it with the project's venv "
             "(.venv/bin/python tools/plot_metrics.py RUN_DIR), which scripts/setup.sh makes")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(run_dir):
    """The run's training and validation records, one per step.

    zaya writes each record whole and, on resume, drops the records of steps it replays, so a
    file it wrote holds each step once. Two things are still tolerated: a torn last line (the run
    was killed in the middle of a write and not resumed since; skipped with a note), and a step
    written again (a file from before those rules): the later record wins, and a record of step s
    discards the earlier ones of steps >= s, as a resume from step s - 1 replays them.
    """
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        sys.exit(f"plot_metrics: {path} does not exist (is {run_dir} a zaya run directory?)")
    train, val = [], []
    with open(path) as f:
        lines = f.read().split("\n")
    # The text after the last newline is a torn record (empty when the file ends in one).
    if lines[-1].strip():
        print(f"plot_metrics: {path}: skipping a torn last line ({len(lines[-1])} bytes, no newline)", file=sys.stderr)
    for n, line in enumerate(lines[:-1], 1):
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_metrics: {path}:{n}: not JSON ({e})")
        if "event" in r:  # a recipe's phase_start record (docs/train.md), not a step
            continue
        records = val if "val_loss" in r else train
        while records and records[-1]["step"] >= r["step"]:
            records.pop()  # replayed after a resume: the later record wins
        records.append(r)
    return train, val


def smooth(xs, k=10):
    out, acc = [], []
    for x in xs:
        acc.append(x)
        if len(acc) > k:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--labels")
    ap.add_argument("--baseline", type=float, help="unigram baseline (nats/token) drawn on the loss plot")
    ap.add_argument("--window", type=int, default=50, help="steps per window of the printed expert-balance table")
    a = ap.parse_args()
    out = a.out or a.runs[0]
    os.makedirs(out, exist_ok=True)
    labels = a.labels.split(",") if a.labels else [os.path.basename(os.path.normpath(r)) for r in a.runs]
    runs = [load(r) for r in a.runs]

    fig, ax = plt.subplots(figsize=(8, 5))
    for (train, val), label in zip(runs, labels):
        tok = [r["tokens"] / 1e6 for r in train]
        (line,) = ax.plot(tok, smooth([r["loss"] for r in train]), label=f"{label} train (smoothed)", alpha=0.8)
        if val:
            ax.plot([r["tokens"] / 1e6 for r in val], [r["val_loss"] for r in val], "o-", color=line.get_color(),
                    label=f"{label} validation")
    if a.baseline:
        ax.axhline(a.baseline, color="gray", ls="--", label=f"unigram baseline {a.baseline:.3f}")
        ax.axhline(a.baseline - 1.5, color="gray", ls=":", label="baseline − 1.5 nats")
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=110)

    for key, name, ylabel in (("lr", "lr.png", "learning rate"), ("grad_norm", "grad_norm.png", "global grad norm (pre-clip)")):
        fig, ax = plt.subplots(figsize=(8, 4))
        for (train, _), label in zip(runs, labels):
            ax.plot([r["step"] for r in train], [r[key] for r in train], label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)

    train, _ = runs[0]
    layers = len(train[0]["expert_entropy"]) if train else 0
    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    steps = [r["step"] for r in train]
    for l in range(layers):
        axes[0].plot(steps, smooth([r["expert_entropy"][l] for r in train], 5), label=f"layer {l}")
        axes[1].plot(steps, smooth([r["expert_max_load"][l] for r in train], 5), label=f"layer {l} max")
    axes[0].axhline(0.95, color="gray", ls="--", label="0.95")
    axes[0].set_ylabel("normalized load entropy")
    axes[1].axhline(1.0, color="gray", ls="--")
    axes[1].set_ylabel("max expert load / fair share")
    axes[1].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"expert balance ({labels[0]})")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "expert_load.png"), dpi=110)
    print(f"plot_metrics: wrote loss.png, lr.png, grad_norm.png, expert_load.png to {out}")
    for (train, _), label in zip(runs, labels):
        print_balance(train, label, a.window)


def print_balance(train, label, window):
    """Prints each layer's normalized expert-load entropy, averaged over windows of `window` steps."""
    if not train or "expert_entropy" not in train[0]:
        return
    layers = len(train[0]["expert_entropy"])
    print(f"expert-load entropy, {label}: mean per {window}-step window (1 = uniform)")
    print("  steps        " + " ".join(f"layer {l:<2}" for l in range(layers)))
    for a in range(0, len(train), window):
        w = train[a:a + window]
        means = [sum(r["expert_entropy"][l] for r in w) / len(w) for l in range(layers)]
        print(f"  {w[0]['step']:>4}-{w[-1]['step']:<6} " + " ".join(f"{m:8.3f}" for m in means))


if __name__ == "__main__":
    main()
