"""One training step (forward + backward of the next-token loss) of a ZAYA1 model in zaya and in
transformers' ZayaForCausalLM (torch CPU, fp32, same thread count), in one run.

zaya side: `zaya --threads N bench step --init-config CFG --steps S --batch B --seq T` (random
tokens, one untimed warm-up step, mean over S steps). transformers side: the same shapes, the same
kind of random tokens, model(input_ids, labels).loss.backward(), one untimed warm-up, mean over S.
Both models start from their own random init (routing is input-dependent on both sides; HF's key
temperature init is 0, zaya's 1 — neither changes the FLOPs).

Prints tokens/s of each, the ratio, phase times and zaya's activation arena per step; also zaya
with --gemm-dtype bf16 (every weight GEMM, experts, attention and router projections and the LM
head, on bf16 copies, f32 accumulation; attention, conv, norms and softmax stay fp32).

The three measurements run interleaved for --rounds rounds (zaya fp32, zaya bf16, transformers in
each) and the ratios are taken per round and as the median: on a shared VM whose speed drifts
within minutes, only measurements taken side by side compare. With --pairing step (the default)
the two zaya programs stay resident (`zaya bench step --paced`, one step per line on its stdin)
next to one transformers model, and a round alternates single steps of the three, rotating which
goes first, so each program's steps are timed within a second of the others'. --pairing block
runs each measurement as a block of --steps steps (zaya as a new process each round) with a new
transformers model each round, which steps ~11% slower than a kept one: it reads ~5% in zaya's
favour (docs/results/model-cpu.md). Each round starts with a machine
probe (the best of five 1024³ fp32 matmuls in torch on the same threads: the FMA speed of that
moment, measured by neither program), so rounds can be compared by the machine's state
(tools/pool_model_vs_hf.py --by-probe). Each line also shows the CPU time the hypervisor stole
during it (/proc/stat), one visible part of that drift; a round in which any of
its three measurements lost more than --max-steal percent (default 5) is printed but left out of
the median, since it timed the neighbours' load rather than either program (if every round is
like that, the median is over all of them and says so). zaya reports the wall
time of its library GEMMs; transformers' step divided by that time is the ratio zaya would reach
if everything besides the GEMMs (which both sides run at the same FLOP count) took no time.

Run: benchmarks/model_vs_hf.sh --zaya build/cuda/zaya --threads 2 --rounds 5 (the environment of scripts/env.sh)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The demo shapes (task spec; configs/demo.toml's [model] section is used instead when it exists).
DEMO = dict(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, num_experts=8, moe_intermediate_size=512, router_hidden_size=64)


def model_config(path):
    cfg = dict(DEMO)
    if path and Path(path).exists():
        import tomllib
        with open(path, "rb") as f:
            cfg.update({k: v for k, v in tomllib.load(f).get("model", {}).items() if k in DEMO})
    return cfg


def zaya_bench_command(binary, cfg, threads, batch, seq, steps, gemm_dtype, workdir):
    """`zaya bench step` on cfg's model (written as a TOML into workdir)."""
    toml = Path(workdir) / "model.toml"
    toml.write_text("[model]\n" + "".join(f"{k} = {v}\n" for k, v in cfg.items()))
    return [binary, "--threads", str(threads), "bench", "step", "--init-config", str(toml), "--seed", "1",
            "--steps", str(steps), "--batch", str(batch), "--seq", str(seq), "--gemm-dtype", gemm_dtype]


def arena_mib(out):
    """The activation arena from a bench summary, in MiB."""
    return float(re.search(r"activation arena ([\d.]+) MiB", out)[1])


def run_zaya(binary, cfg, threads, batch, seq, steps, gemm_dtype="f32"):
    """The block pairing's zaya measurement: a new process, its warm-up step, then steps timed."""
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(zaya_bench_command(binary, cfg, threads, batch, seq, steps, gemm_dtype, d),
                             check=True, capture_output=True, text=True).stdout
    m = re.search(r"forward ([\d.]+) ms, backward ([\d.]+) ms, step ([\d.]+) ms", out)
    g = re.search(r"GEMMs ([\d.]+) ms per step \(\d+ calls, ([\d.]+) GFLOP", out)
    return dict(fwd=float(m[1]), bwd=float(m[2]), step=float(m[3]), arena_mib=arena_mib(out),
                gemm_ms=float(g[1]), gemm_gflop=float(g[2]))


class PacedZaya:
    """A resident `zaya bench step --paced` process: step() runs one timed training step."""

    def __init__(self, binary, cfg, threads, batch, seq, max_steps, gemm_dtype="f32"):
        self.dir = tempfile.TemporaryDirectory()
        self.cmd = zaya_bench_command(binary, cfg, threads, batch, seq, max_steps, gemm_dtype, self.dir.name) + [
            "--paced"]
        self.p = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, bufsize=1)
        line = self.p.stdout.readline()
        if line.strip() != "bench: ready":
            self.fail(line)

    def fail(self, line):
        self.p.kill()
        _, err = self.p.communicate()
        raise RuntimeError(f"{' '.join(self.cmd)}: expected a paced-bench line, got {line!r}; stderr: {err.strip()}")

    def step(self):
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        m = re.match(r"bench: step \d+ forward ([\d.]+) ms backward ([\d.]+) ms gemm ([\d.]+) ms ([\d.]+) GFLOP",
                     line)
        if not m:
            self.fail(line)
        fwd, bwd = float(m[1]), float(m[2])
        return dict(fwd=fwd, bwd=bwd, step=fwd + bwd, gemm_ms=float(m[3]), gemm_gflop=float(m[4]))

    def close(self):
        """Ends the process (the end of its stdin ends the run) and returns its activation arena in MiB."""
        out, err = self.p.communicate("")
        if self.p.returncode != 0:
            raise RuntimeError(f"{' '.join(self.cmd)} exited {self.p.returncode}: {err.strip()}")
        self.dir.cleanup()
        return arena_mib(out)


class HfModel:
    """transformers' ZayaForCausalLM on the demo shapes, kept between steps: step() runs one timed step."""

    def __init__(self, cfg, threads, batch, seq, attn):
        import torch
        from transformers import ZayaConfig, ZayaForCausalLM
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        hc = ZayaConfig(**cfg, max_position_embeddings=max(4096, seq),
                        layer_types=["hybrid"] * cfg["num_hidden_layers"], attn_implementation=attn)
        self.model = ZayaForCausalLM(hc).float().train()
        self.ids = torch.randint(1, cfg["vocab_size"], (batch, seq))

    def step(self):
        self.model.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        loss = self.model(input_ids=self.ids, labels=self.ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return dict(fwd=1e3 * (t1 - t0), bwd=1e3 * (t2 - t1), step=1e3 * (t2 - t0))


def paired_round(programs, steps, settle_s=0.0, run_length=1):
    """steps steps of each program, in turns of run_length consecutive steps (1: single steps
    alternating), the program that starts rotating from turn to turn; per program the mean times and
    the share of CPU time stolen over its own steps. settle_s: a pause before each change of
    program, in which the OpenMP threads of the program that ran last stop spinning."""
    if steps % run_length:
        raise ValueError(f"--steps {steps} is not a multiple of --run-length {run_length}")
    order = [(j + k) % len(programs) for k in range(steps // run_length) for j in range(len(programs))]
    sums = [dict() for _ in programs]
    stolen = [[0, 0] for _ in programs]  # steal and total jiffies over the program's steps
    for i in order:
        for n in range(run_length):
            if settle_s > 0 and n == 0:
                time.sleep(settle_s)
            a = cpu_times()
            r = programs[i].step()
            b = cpu_times()
            if a and b:
                stolen[i][0] += b[1] - a[1]
                stolen[i][1] += b[0] - a[0]
            for key, v in r.items():
                sums[i][key] = sums[i].get(key, 0.0) + v
    out = []
    for total, (st, all_) in zip(sums, stolen):
        m = {key: v / steps for key, v in total.items()}
        m["steal"] = 100.0 * st / max(1, all_) if all_ else float("nan")
        out.append(m)
    return out


def cpu_times():
    """(busy + idle, steal) jiffies from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    return sum(v), (v[7] if len(v) > 7 else 0)


def timed(fn, *args):
    """fn(*args) with the share of CPU time the hypervisor stole meanwhile (percent, or nan)."""
    a = cpu_times()
    r = fn(*args)
    b = cpu_times()
    r["steal"] = 100.0 * (b[1] - a[1]) / max(1, b[0] - a[0]) if a and b else float("nan")
    return r


def machine_probe(threads):
    """The machine's fp32 FMA speed this moment, independent of both programs: the best of five 1024³ fp32
    matmuls in torch on the same thread count (~2 GFLOP each), in GFLOP/s. On a shared VM this moves by up
    to 2× within minutes; the pooling tool splits rounds by it (tools/pool_model_vs_hf.py --by-probe)."""
    import torch
    torch.set_num_threads(threads)
    a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * 1024 ** 3 / best * 1e-9


def run_hf(cfg, threads, batch, seq, steps, attn):
    """The block pairing's transformers measurement: a new model, one untimed step, then steps timed."""
    model = HfModel(cfg, threads, batch, seq, attn)
    model.step()
    times = [model.step() for _ in range(steps)]
    return {k: sum(t[k] for t in times) / steps for k in ("fwd", "bwd", "step")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zaya", default=os.environ.get("ZAYA_BINARY", str(ROOT / "build/cpu/zaya")))
    ap.add_argument("--config", default=str(ROOT / "configs/demo.toml"), help="TOML with a [model] section")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--attn", default="sdpa", help="transformers attention implementation (sdpa or eager)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three measurements")
    ap.add_argument("--pairing", choices=("step", "block"), default="step",
                    help="step: resident programs, single steps alternating within a round; block: each "
                         "measurement a block of --steps steps, zaya a new process each round")
    ap.add_argument("--settle-ms", type=float, default=20.0,
                    help="--pairing step: pause this long before each step, so that the threads of the "
                         "program that ran last have stopped spinning (libgomp spins ~5-10 ms after a parallel region)")
    ap.add_argument("--run-length", type=int, default=1,
                    help="--pairing step: consecutive steps of one program before the next program's (1: "
                         "single steps alternating; --steps: blocks of steps of the resident programs)")
    ap.add_argument("--warmup-rounds", type=int, default=1,
                    help="untimed transformers measurements before the rounds (see main)")
    ap.add_argument("--max-steal", type=float, default=5.0,
                    help="rounds in which the hypervisor stole more than this percentage of the CPU time during "
                         "any of the three measurements are printed but left out of the median")
    a = ap.parse_args()
    cfg = model_config(a.config)
    tokens = a.batch * a.seq
    print(f"model {cfg}")
    print(f"batch {a.batch} x {a.seq} = {tokens} tokens/step, {a.steps} timed steps, {a.threads} threads, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    # transformers' first measurement in a process runs ~1.5× slower than the later ones even after
    # its own warm-up step (1000-1250 against 630-870 ms per step in ten runs on a 2-core Zen 4),
    # which would make round 1 flatter zaya. One untimed measurement first, so every round
    # times the steady state; zaya runs as a new process each round and its warm-up step is enough.
    # (Paired: one untimed round of all three, after zaya's own warm-up step.)
    paired = a.pairing == "step"
    if paired:
        print(f"pairing: single steps of zaya fp32, zaya bf16 GEMMs and transformers alternate, the first "
              f"rotating; {a.steps} steps of each per round, the programs resident"
              + (f"; turns of {a.run_length} steps" if a.run_length > 1 else ""))
        total = (a.warmup_rounds + a.rounds) * a.steps
        programs = [PacedZaya(a.zaya, cfg, a.threads, a.batch, a.seq, total),
                    PacedZaya(a.zaya, cfg, a.threads, a.batch, a.seq, total, "bf16"),
                    HfModel(cfg, a.threads, a.batch, a.seq, a.attn)]
        for _ in range(a.warmup_rounds):
            w = paired_round(programs, a.steps, a.settle_ms / 1e3, a.run_length)[2]
    else:
        for _ in range(a.warmup_rounds):
            w = run_hf(cfg, a.threads, a.batch, a.seq, a.steps, a.attn)
    if a.warmup_rounds > 0:
        print(f"transformers warm-up (untimed for the ratios): step {w['step']:.1f} ms")
    rounds = []
    for r in range(a.rounds):
        probe = machine_probe(a.threads)
        if paired:
            z, zb, h = paired_round(programs, a.steps, a.settle_ms / 1e3, a.run_length)
        else:
            z = timed(run_zaya, a.zaya, cfg, a.threads, a.batch, a.seq, a.steps)
            zb = timed(run_zaya, a.zaya, cfg, a.threads, a.batch, a.seq, a.steps, "bf16")
            h = timed(run_hf, cfg, a.threads, a.batch, a.seq, a.steps, a.attn)
        print(f"round {r + 1}")
        print(f"  machine probe (torch fp32 1024^3 matmul, best of 5, before the round): {probe:.1f} GFLOP/s")
        for name, m in (("zaya fp32", z), ("zaya bf16 GEMMs", zb), (f"transformers fp32 ({a.attn})", h)):
            print(f"  {name:28s} forward {m['fwd']:8.1f} ms  backward {m['bwd']:8.1f} ms  step {m['step']:8.1f} ms  "
                  f"{tokens / m['step'] * 1e3:8.1f} tokens/s  steal {m['steal']:4.1f}%")
        print(f"  zaya fp32 GEMMs: {z['gemm_ms']:.1f} ms of the step ({z['gemm_gflop']:.1f} GFLOP at "
              f"{z['gemm_gflop'] / z['gemm_ms'] * 1e3:.1f} GFLOP/s), everything else {z['step'] - z['gemm_ms']:.1f} ms")
        ratios = dict(fp32=h["step"] / z["step"], bf16=h["step"] / zb["step"], floor=h["step"] / z["gemm_ms"])
        steal = max(m["steal"] for m in (z, zb, h))
        clean = not steal > a.max_steal  # nan (no /proc/stat) counts as clean
        print(f"  ratio zaya fp32 / transformers fp32 (tokens/s): {ratios['fp32']:.2f}x; bf16 GEMMs: "
              f"{ratios['bf16']:.2f}x; GEMM floor (transformers step / zaya GEMM time): {ratios['floor']:.2f}x"
              + ("" if clean else f"  [left out of the median: {steal:.1f}% stolen > {a.max_steal:g}%]"))
        rounds.append((ratios, clean))
    kept = [r for r, c in rounds if c]
    if not kept:
        print(f"every round had more than {a.max_steal:g}% of its CPU time stolen: the median below is over all "
              f"of them and measures the hypervisor as much as the code")
        kept = [r for r, _ in rounds]
    med = {k: statistics.median(r[k] for r in kept) for k in kept[0]}
    print(f"median over {len(kept)} of {a.rounds} rounds: zaya fp32 / transformers fp32 {med['fp32']:.2f}x, "
          f"zaya bf16 GEMMs / transformers fp32 {med['bf16']:.2f}x, GEMM floor {med['floor']:.2f}x")
    arenas = (programs[0].close(), programs[1].close()) if paired else (z["arena_mib"], zb["arena_mib"])
    print(f"zaya activation arena per step: fp32 {arenas[0]:.1f} MiB, bf16 GEMMs {arenas[1]:.1f} MiB")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
