#!/usr/bin/env python3
"""How much slower transformers' step is on a freshly built model than on one that has run for a while.

benchmarks/model_vs_hf.py's block pairing (its only form before session 21) built a new
ZayaForCausalLM every round and timed 3 steps after one untimed warm-up step. This tool times
that against a model kept for the whole run, both each round (which goes first alternating):

  .venv/bin/python tools/hf_fresh_model_probe.py --threads 2 --rounds 6     (after scripts/env.sh)

Per round it prints both step times and fresh/kept; a ratio above 1 is how much the block
pairing flattered zaya. Result: docs/results/model-cpu-sessions.md, session 21.
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import model_vs_hf as mv  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(mv.ROOT / "configs/demo.toml"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per measurement (the block pairing's 3)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--attn", default="sdpa")
    a = ap.parse_args()
    cfg = mv.model_config(a.config)
    kept = mv.HfModel(cfg, a.threads, a.batch, a.seq, a.attn)
    for _ in range(4):  # past the first steps of a process (see model_vs_hf.py's warm-up note)
        kept.step()
    ratios = []
    for r in range(a.rounds):
        # Which goes first alternates, so neither gains from the order.
        if r % 2:
            kept_ms = statistics.mean(kept.step()["step"] for _ in range(a.steps))
        fresh = mv.run_hf(cfg, a.threads, a.batch, a.seq, a.steps, a.attn)["step"]
        if not r % 2:
            kept_ms = statistics.mean(kept.step()["step"] for _ in range(a.steps))
        ratios.append(fresh / kept_ms)
        print(f"round {r + 1}: fresh model {fresh:.1f} ms, kept model {kept_ms:.1f} ms, "
              f"fresh/kept {ratios[-1]:.3f}", flush=True)
    print(f"median fresh/kept over {a.rounds} rounds: {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
