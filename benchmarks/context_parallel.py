#!/usr/bin/env python3
"""Context parallelism on this machine: `zaya train` on the demo model at one long sequence per
micro-batch with parallel.cp = 1, 2 (and 4 for memory only), from each run's start-up log and
metrics.jsonl.

Prints markdown tables:
  - activation memory per rank (the model's arena, from the start-up summary) against cp;
  - bytes each rank sends per layer per micro-batch, measured (the trainer's counter of the
    context-parallel exchanges, metrics.jsonl "context_parallel") against what the same exchanges
    would send for a full multi-head K/V of the same hidden size (H per token instead of CCA's nkv·hd);
  - median step time and tokens/s at cp = 1 and 2, with the threads split so both use the same
    cores (cp = 2: two ranks of threads/2);
  - at cp = 2, the two attention schedules (parallel.cp_overlap = true / false): the exchange time
    rank 0 spent blocked per layer (the trainer's counter: inside the exchanges' start and wait
    calls, what compute did not hide, waiting for the other rank included) and the step time.
    --schedules runs only this comparison, alternating the two --repeats times.

    python3 benchmarks/context_parallel.py [--zaya build/cuda/zaya] [--seq 2048] [--steps 6]
                                           [--schedules [--repeats 3]]

Needs the demo's data (scripts/demo.sh prepares data/pydocs_*).
"""
import argparse
import os
import re
import statistics
import tempfile

from demo_train import train_demo

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def run(zaya, cp, threads, seq, steps, out, extra=()):
    sets = list(extra) + [f"train.steps={steps}", "train.micro_batch=1", "train.grad_accum=1", f"train.seq_len={seq}",
            "train.eval_every=0", "train.progress=false", "ckpt.every=0", "ckpt.save_final=false",
            f"train.out_dir={out}", "optim.warmup_steps=2", f"parallel.cp={cp}", "model.max_position_embeddings=" +
            str(max(seq, 4096))]
    log, recs = train_demo(zaya, cp, threads, sets, out)
    act = re.search(r"activations ([0-9.]+) (B|KiB|MiB|GiB)", log)
    return recs, float(act.group(1)) * UNITS[act.group(2)]


def demo_shape():
    text = open("configs/demo.toml").read()
    get = lambda k: int(re.search(rf"^{k}\s*=\s*(\d+)", text, re.M).group(1))
    return {k: get(k) for k in ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                                "hidden_size"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zaya", default="build/cuda/zaya")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--schedules", action="store_true", help="only the cp = 2 overlapped/blocking comparison")
    ap.add_argument("--repeats", type=int, default=3, help="--schedules: alternations of the two schedules")
    a = ap.parse_args()
    m = demo_shape()
    L, nq, nkv, hd = m["num_hidden_layers"], m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"]
    H = m["hidden_size"]  # full multi-head attention's K (and V) per token: H = heads · head_dim
    if a.schedules:
        return schedules(a, L)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cp in (1, 2, 4):
            threads = max(1, a.threads // min(cp, 2)) if cp <= 2 else 1
            recs, act = run(a.zaya, cp, threads, a.seq, a.steps, os.path.join(tmp, f"cp{cp}"))
            rows[cp] = (recs, act, threads)
    print(f"demo model (L {L}, heads {nq}/{nkv} x {hd}), one sequence of {a.seq} tokens per micro-batch, "
          f"{a.steps} steps\n")
    print("| cp | activations per rank | vs cp = 1 |")
    print("|---|---|---|")
    for cp, (_, act, _) in rows.items():
        print(f"| {cp} | {act / 2**20:.1f} MiB | {act / rows[1][1]:.3f} |")
    print("\n| cp | bytes sent per rank per layer (CCA, measured) | full multi-head K/V (same exchanges) | ratio |")
    print("|---|---|---|---|")
    for cp, (recs, _, _) in rows.items():
        if cp == 1:
            continue
        sent = statistics.median(r["context_parallel"]["bytes_sent"] for r in recs) / L
        # The K/V exchanges scale with the K/V width; the halo (two positions per chunk) does not.
        halo = 2 * 4.0 * (cp - 1) * 4 * ((nq + nkv) * hd + nkv * hd)  # two all-gathers of [4, C + kv] f32
        kv_part = sent - halo
        full = kv_part * H / (nkv * hd) + halo
        print(f"| {cp} | {sent / 2**20:.2f} MiB | {full / 2**20:.2f} MiB | {full / sent:.2f} |")
    print("\n| cp | ranks x threads | median step | tokens/s |")
    print("|---|---|---|---|")
    for cp, (recs, _, threads) in rows.items():
        if cp > 2:
            continue  # oversubscribed on this machine's two cores: its time says nothing
        t = statistics.median(r["time"]["step"] for r in recs[2:])
        print(f"| {cp} | {cp} x {threads} | {t:.2f} s | {a.seq / t:.0f} |")


def schedules(a, L):
    """cp = 2 with each attention schedule, alternated --repeats times (the machine's load drifts
    between runs): blocked exchange time per layer and step time, per run and their medians."""
    threads = max(1, a.threads // 2)
    print(f"cp = 2 (2 ranks x {threads} threads), one sequence of {a.seq} tokens, {a.steps} steps per run "
          f"(the first two left out), the schedules alternated {a.repeats} times\n")
    print("| run | schedule | exchange blocked per layer (rank 0, median step) | median step | tokens/s |")
    print("|---|---|---|---|---|")
    got = {"blocking": [], "overlapped": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for name, flag in (("blocking", "false"), ("overlapped", "true")):
                out = os.path.join(tmp, f"{name}{i}")
                recs, _ = run(a.zaya, 2, threads, a.seq, a.steps, out, [f"parallel.cp_overlap={flag}"])
                recs = recs[2:]
                blocked = statistics.median(r["context_parallel"]["blocked_s"] for r in recs) / L
                t = statistics.median(r["time"]["step"] for r in recs)
                got[name].append((blocked, t))
                print(f"| {i + 1} | {name} | {1e3 * blocked:.1f} ms | {t:.2f} s | {a.seq / t:.0f} |", flush=True)
    print("\n| schedule | median blocked per layer | median step |")
    print("|---|---|---|")
    for name, rows in got.items():
        print(f"| {name} | {1e3 * statistics.median(b for b, _ in rows):.1f} ms | "
              f"{statistics.median(t for _, t in rows):.2f} s |")


if __name__ == "__main__":
    main()
