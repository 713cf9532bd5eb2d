"""Where transformers' ZayaForCausalLM spends a training step of the demo shapes on the CPU: torch's
profiler over a few steps (after warm-up ones), ops sorted by their own CPU time. It sits beside
`zaya forward --bench-steps N --sections --gemm-shapes`, for comparing the two programs part by part
(docs/results/model-cpu.md, session 22).

Run (after scripts/setup.sh; source scripts/env.sh first):
  .venv/bin/python tools/hf_step_profile.py [--threads 2] [--steps 3] [--rows 30]
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import ZayaConfig, ZayaForCausalLM

# configs/demo.toml's [model] (as benchmarks/model_vs_hf.py builds it).
DEMO = dict(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, num_experts=8, moe_intermediate_size=512, router_hidden_size=64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rows", type=int, default=30, help="ops to list")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = ZayaConfig(**DEMO, max_position_embeddings=max(4096, a.seq),
                     layer_types=["hybrid"] * DEMO["num_hidden_layers"], attn_implementation="sdpa")
    model = ZayaForCausalLM(cfg).float().train()
    ids = torch.randint(1, DEMO["vocab_size"], (a.batch, a.seq))

    def step():
        model.zero_grad(set_to_none=False)
        model(input_ids=ids, labels=ids).loss.backward()

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            step()
    print(f"transformers ZayaForCausalLM, {a.batch} x {a.seq} tokens, {a.threads} threads, {a.steps} steps profiled "
          f"(divide the times by {a.steps} for one step)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
