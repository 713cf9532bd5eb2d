#!/usr/bin/env python3
"""Data-parallel step time on this machine: `zaya train` on the demo model at 1 and N ranks with
the same global batch, per gradient-reduction mode, weight precision and parameter-gather overlap,
from each run's metrics.jsonl.

Prints a markdown table: median step time and its parts (forward, backward, optimizer), the
data-parallel communication (time in flight, the part hidden behind backward, the part exposed
after it, the parameter all-gather in flight and the part the step waited for), and the bytes each
rank sends per step in theory (reduce-scatter + all-gather: 2·(N−1)/N of the buffer); and the
bf16 and f32 modes' loss trajectories against the order-independent f64 mode's (their reduction
error as it reaches the training loss).

    python3 benchmarks/data_parallel.py [--zaya build/cuda/zaya] [--steps 20] [--ranks 2]

Needs the demo's data (scripts/demo.sh prepares data/pydocs_*).
"""
import argparse
import os
import re
import shutil
import statistics
import tempfile

from demo_train import train_demo


def run(zaya, ranks, threads, reduce, steps, micro, global_micro, out, bucket_mb, params="f32", overlap=True):
    sets = [f"parallel.bucket_mb={bucket_mb}", f"train.param_dtype=\"{params}\"",
        f"parallel.overlap_param_gather={'true' if overlap else 'false'}",
        f"train.steps={steps}", f"train.micro_batch={micro}", f"train.grad_accum={global_micro // ranks}",
        "train.eval_every=0", "train.progress=false", "ckpt.every=0", "ckpt.save_final=false",
        f"train.out_dir={out}", f"parallel.grad_reduce=\"{reduce}\"", "optim.warmup_steps=5",
    ]
    if params == "bf16":  # bf16 weights are read by bf16 GEMMs as stored
        sets.append("train.gemm_dtype=\"bf16\"")
    log, recs = train_demo(zaya, ranks, threads, sets, out)
    sent = re.search(r"([0-9.]+) MiB sent per rank per step", log)
    return recs, float(sent.group(1)) if sent else 0.0


def median(recs, get):
    vals = [get(r) for r in recs[3:]]  # the first steps warm caches and the allocator
    return statistics.median(vals) if vals else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zaya", default="build/cuda/zaya")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    # This VM's MPI reduce-scatter saturates near 128 KiB (docs/data-parallel.md, "Bucket size"):
    # by that rule each of the demo's layers is its own bucket.
    ap.add_argument("--bucket-mb", type=float, default=0.125)
    args = ap.parse_args()
    global_micro = 2 * args.ranks
    tmp = tempfile.mkdtemp(prefix="zaya_dp_bench_")
    rows, losses = [], {}
    try:
        n, per = args.ranks, max(1, args.threads // args.ranks)
        # (ranks, threads, gradient reduction, weights, parameter gather prefetched)
        configs = [(1, args.threads, "f32", "f32", True), (n, per, "f32", "f32", False), (n, per, "f32", "f32", True),
                   (n, per, "bf16", "f32", True), (n, per, "f64", "f32", True), (n, per, "bf16", "bf16", True)]
        for ranks, threads, mode, params, overlap in configs:
            out = os.path.join(tmp, f"n{ranks}-{mode}-{params}-{overlap}")
            recs, sent = run(args.zaya, ranks, threads, mode, args.steps, args.micro, global_micro, out, args.bucket_mb,
                             params, overlap)
            t = lambda k: median(recs, lambda r: r["time"][k])
            dp = lambda k: median(recs, lambda r: r.get("data_parallel", {}).get(k, 0.0))
            rows.append((ranks, threads, mode, params, "yes" if overlap and ranks > 1 else "no", t("step"),
                         t("forward"), t("backward"), t("optimizer"), dp("comm"), dp("hidden"), dp("exposed"),
                         dp("param_gather"), dp("param_gather_exposed"), sent))
            if params == "f32" and overlap:
                losses[(ranks, mode)] = [r["loss"] for r in recs]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"demo model, global batch {global_micro} x {args.micro} sequences of 256 tokens, "
          f"buckets of {args.bucket_mb} MiB, median of steps 4..{args.steps}\n")
    print("| ranks | threads/rank | reduce | weights | gather prefetched | step s | forward s | backward s | "
          "optimizer s | comm s | hidden s | exposed s | param gather s | gather waited s | MiB sent/rank/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %d | %s | %s | %s | %.3f | %.3f | %.3f | %.3f | %.4f | %.4f | %.4f | %.4f | %.4f | %.2f |" % r)
    ref = losses[(args.ranks, "f64")]
    print(f"\nLoss against the f64 mode at {args.ranks} ranks (which equals 1 rank's f64 run bitwise):\n")
    print("| reduce | max relative loss difference over the run | at the last step |")
    print("|---|---|---|")
    for mode in ("f32", "bf16"):
        l = losses[(args.ranks, mode)]
        d = [abs(a - b) / abs(b) for a, b in zip(l, ref)]
        print(f"| {mode} | {max(d):.2e} | {d[-1]:.2e} |")


if __name__ == "__main__":
    main()
