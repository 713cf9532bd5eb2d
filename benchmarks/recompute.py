#!/usr/bin/env python3
"""Memory and time of activation recomputation (`zaya bench step --recompute`, train.recompute).

For each shape (batch x seq, optionally a layer count other than the config's), runs `zaya bench
step` with and without --recompute, alternating the two `--pairs` times so that a machine whose
speed drifts slows both alike, and prints a markdown table: the activation arena and the process's
peak RSS (each run is its own process, so its peak is its own), the forward, backward and step
times (median over the pairs of each run's mean), and the loss (it must be the same: recompute is
bitwise the same step).

  benchmarks/recompute.py [--zaya build/cuda/zaya] [--config configs/demo.toml]
                          [--shape 8x256 --shape 1x4096 --shape 8x256:L16] [--steps 3] [--pairs 3]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_shape(s):
    m = re.fullmatch(r"(\d+)x(\d+)(?::L(\d+))?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"shape '{s}': expected BATCHxSEQ or BATCHxSEQ:LLAYERS, e.g. 8x256:L16")
    return int(m[1]), int(m[2]), int(m[3]) if m[3] else None


def config_with_layers(config, layers, tmp):
    """The config's text with model.num_hidden_layers replaced (the bench reads only [model])."""
    text = open(config).read()
    text, n = re.subn(r"(?m)^num_hidden_layers\s*=\s*\d+", f"num_hidden_layers = {layers}", text)
    if n != 1:
        sys.exit(f"recompute.py: {config} has no single num_hidden_layers line to replace")
    path = os.path.join(tmp, f"layers{layers}.toml")
    open(path, "w").write(text)
    return path


def run_bench(zaya, config, batch, seq, steps, recompute):
    cmd = [zaya, "bench", "step", "--init-config", config, "--seed", "1", "--steps", str(steps), "--batch",
           str(batch), "--seq", str(seq)] + (["--recompute"] if recompute else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"recompute.py: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    t = re.search(r"bench: forward ([\d.]+) ms, backward ([\d.]+) ms, step ([\d.]+) ms", out.stdout)
    mem = re.search(r"bench: memory: activation arena ([\d.]+) MiB, peak RSS ([\d.]+) MiB", out.stdout)
    loss = re.search(r"loss ([\d.]+), recompute (on|off)", out.stdout)
    if not (t and mem and loss) or (loss[2] == "on") != recompute:
        sys.exit(f"recompute.py: unexpected output of {' '.join(cmd)}:\n{out.stdout}")
    return {"forward": float(t[1]), "backward": float(t[2]), "step": float(t[3]), "arena": float(mem[1]),
            "rss": float(mem[2]), "loss": loss[1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zaya", default=os.path.join(ROOT, "build", "cuda", "zaya"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "demo.toml"))
    ap.add_argument("--shape", type=parse_shape, action="append",
                    help="BATCHxSEQ[:LLAYERS] (repeatable; default 8x256 and 1x4096)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--pairs", type=int, default=3, help="alternated (off, on) run pairs per shape")
    a = ap.parse_args()
    shapes = a.shape or [(8, 256, None), (1, 4096, None)]
    print("| shape | layers | recompute | activation arena MiB | peak RSS MiB | forward ms | backward ms | step ms | "
          "step vs off | loss |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for batch, seq, layers in shapes:
            config = config_with_layers(a.config, layers, tmp) if layers else a.config
            runs = {False: [], True: []}
            for _ in range(a.pairs):
                for rc in (False, True):
                    runs[rc].append(run_bench(a.zaya, config, batch, seq, a.steps, rc))
            losses = {r["loss"] for rc in runs for r in runs[rc]}
            if len(losses) != 1:
                sys.exit(f"recompute.py: the loss differs between runs of {batch}x{seq}: {sorted(losses)}")
            med = {rc: {k: statistics.median(r[k] for r in runs[rc]) for k in ("forward", "backward", "step", "rss")}
                   for rc in runs}
            L = layers or int(re.search(r"(?m)^num_hidden_layers\s*=\s*(\d+)", open(a.config).read())[1])
            for rc in (False, True):
                m, r0 = med[rc], runs[rc][0]
                print(f"| {batch} x {seq} | {L} | {'on' if rc else 'off'} | {r0['arena']:.1f} | {m['rss']:.0f} | "
                      f"{m['forward']:.1f} | {m['backward']:.1f} | {m['step']:.1f} | "
                      f"{m['step'] / med[False]['step']:.2f}x | {r0['loss']} |", flush=True)


if __name__ == "__main__":
    main()
