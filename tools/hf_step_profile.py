"""Where transformers' ZayaForCausalLM spends a training step of the demo shapes on the CPU: torch's
profiler over a few steps (after warm-up ones) of benchmarks/model_vs_hf.py's model, ops sorted by
their own CPU time. It sits beside
`zaya bench step --steps N --sections --gemm-shapes`, for comparing the two programs part by part
(docs/results/model-cpu.md).

Run (after scripts/setup.sh; source scripts/env.sh first):
  .venv/bin/python tools/hf_step_profile.py [--threads 2] [--steps 3] [--rows 30]
"""
import argparse
import sys
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import model_vs_hf as mv  # noqa: E402  (the demo config and the transformers model it times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(mv.ROOT / "configs/demo.toml"), help="TOML with a [model] section")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--rows", type=int, default=30, help="ops to list")
    a = ap.parse_args()
    model = mv.HfModel(mv.model_config(a.config), a.threads, a.batch, a.seq, a.attn)
    for _ in range(3):
        model.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            model.step()
    print(f"transformers ZayaForCausalLM, {a.batch} x {a.seq} tokens, {a.threads} threads, {a.steps} steps profiled "
          f"(divide the times by {a.steps} for one step)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
