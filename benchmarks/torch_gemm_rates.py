"""f32 GEMM rates of torch (its MKL) on the demo LM head's three GEMM shapes and a 2048³ square, to
set beside bench_ops_gemm's oneDNN rates: the model_vs_hf GEMM floor assumes both libraries run the
shared GEMMs at about the same speed.

Run: .venv/bin/python benchmarks/torch_gemm_rates.py [--threads 2]
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    # logits h·Eᵀ, dh = G·E, dE = Gᵀ·h for 2,048 tokens, H 256, V 8192; then the square reference.
    for m, k, n in ((2048, 256, 8192), (2048, 8192, 256), (8192, 2048, 256), (2048, 2048, 2048)):
        x, y = torch.randn(m, k), torch.randn(k, n)
        x @ y  # warm-up
        t = time.perf_counter()
        for _ in range(a.reps):
            x @ y
        dt = (time.perf_counter() - t) / a.reps
        print(f"torch f32 {m}x{k}x{n}: {2 * m * k * n / dt / 1e9:.0f} GFLOP/s ({a.threads} threads)")


if __name__ == "__main__":
    main()
