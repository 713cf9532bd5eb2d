"""zaya against transformers' ZayaForCausalLM on one GPU: training steps of a ZAYA1-base-shaped
model, in one run on the same device, with the goals of issue #38 (MFU >= 40%, >= 3x transformers
eager, >= 1.5x transformers under torch.compile).

What runs, one process at a time (so each has the device to itself and its own peak memory):

- zaya: `zaya bench step --device cuda` on configs/zaya1-base.toml with --set overrides (the layer
  count, and for --smoke tiny shapes): bf16 weights with fp32 master weights (--param-dtype bf16),
  bf16 GEMM inputs (--gemm-dtype bf16), bf16 saved activations (--activation-dtype bf16), the optimizer's update in every step (--optimizer; AdamW,
  as the transformers side, unless --zaya-muon), random tokens. Tokens/s, model FLOPs per token as
  `zaya size` counts them, MFU against --peak-tflops (989: the dense bf16 datasheet peak of an
  H100/H200 SXM), the peak of zaya's tensors on the device. A second, shorter run with --sections
  under CUDA_LAUNCH_BLOCKING=1 splits the step by part (each kernel then finishes before its launch
  returns, so the host's clock sees the device's time; the blocking makes that run slower, so its
  parts are shares, not the step time). `zaya size --hw h200 --measured-step-s` then puts the
  measured step next to the sizing model's prediction.
- transformers: ZayaForCausalLM with the same shapes in bf16 (the whole model cast to bf16, the
  usual way to train it with transformers; torch's AdamW then keeps bf16 moments), the same batch
  of random tokens, model(input_ids, labels).loss.backward(), AdamW step, zero_grad; eager and
  under torch.compile, each in a child process. Tokens/s and torch.cuda.max_memory_allocated();
  the compiled run's first steps (the compilation) are timed separately from the steady steps.
- On a GPU with nvidia-smi, each process's device memory as the driver sees it (the most used
  during the process less what was used before it: allocator caches, library workspaces and the
  CUDA context included) is sampled too, the one memory figure the two sides count alike.

Outputs (--out): gpu_train.json (everything measured), gpu_train.md (the tables) and
gpu_train_step.png (where zaya's step goes). The standard output ends with the result as one
"gpu_train: result {json}" line; `--replot LOG` rebuilds the tables and the plot from that line
(scripts/gpu_check.sh appends the output to a log, since the device tool returns few files).

Choosing --layers and --micro-batch: `zaya size --model configs/zaya1-base.toml --set
model.num_hidden_layers=L --mbs B --seq 4096 --hw h200` predicts memory with bf16 weights and bf16
activations; zaya holds its bf16 weights in f32 storage and its activations in f32, so its peak
is about 20 bytes per parameter (weights, gradients, fp32 masters, AdamW's two moments) plus
twice the printed activations. On a 141 GB H200, 8 layers (2.2B parameters) at micro-batch 1
take about 48 GB and each further layer about 4.7 GB (208M parameters and their activations), so
about 24 layers fit at micro-batch 1 (docs/train.md, "Benchmark against PyTorch").

Run on a GPU machine (the pinned transformers, scripts/requirements.txt, must have ZayaForCausalLM):
    python3 benchmarks/gpu_train.py --zaya build/cuda/zaya --layers 8 --micro-batch 1 --out OUTDIR
On a CPU, as a check of the script itself (tiny shapes, a few seconds):
    .venv/bin/python benchmarks/gpu_train.py --smoke --out /tmp/gpu_train
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "gpu_train: result "
GOALS = {"mfu": 0.40, "vs_eager": 3.0, "vs_compile": 1.5}

# --smoke: ZAYA1-base's structure at tiny sizes (every dimension a multiple of the kernels' tiles
# where it matters), small enough for a CPU test of the script.
SMOKE_SETS = ["model.hidden_size=128", "model.num_attention_heads=2", "model.num_key_value_heads=1",
              "model.head_dim=64", "model.num_experts=4", "model.moe_intermediate_size=128",
              "model.router_hidden_size=64", "model.vocab_size=512", "model.max_position_embeddings=4096"]

# [model] keys that transformers' ZayaConfig takes under the same name.
HF_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "num_experts", "moe_intermediate_size", "router_hidden_size", "rms_norm_eps",
           "max_position_embeddings", "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id")


# ----------------------------------------------------------------------------------------------
# The model config: the TOML's [model] with the --set overrides, as zaya reads it.

def model_config(path, sets):
    with open(path, "rb") as f:
        cfg = dict(tomllib.load(f).get("model", {}))
    for s in sets:
        key, _, value = s.partition("=")
        section, _, name = key.strip().partition(".")
        if section != "model":
            continue
        cfg[name] = tomllib.loads(f"v = {value.strip()}")["v"]
    return cfg


def hf_config_kwargs(cfg):
    """transformers' ZayaConfig arguments for zaya's [model] (rope: the "hybrid" layers' parameters)."""
    kw = {k: cfg[k] for k in HF_KEYS if k in cfg}
    kw["layer_types"] = ["hybrid"] * cfg["num_hidden_layers"]
    kw["rope_parameters"] = {
        "hybrid": {"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 5e6)),
                   "partial_rotary_factor": float(cfg.get("partial_rotary_factor", 0.5))},
        "hybrid_sliding": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    }
    return kw


# ----------------------------------------------------------------------------------------------
# Device memory as the driver sees it, sampled while a child process runs.

class DriverMemory:
    """The most device memory nvidia-smi reports in use while the block runs, less what was in use
    before it (MiB); None without nvidia-smi or off a GPU."""

    def __init__(self, enabled):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.peak = None

    @staticmethod
    def used_mib():
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else None

    def __enter__(self):
        if self.enabled:
            self.base = self.used_mib()
            self.most = self.base
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self.poll, daemon=True)
            self.thread.start()
        return self

    def poll(self):
        while not self.stop.wait(0.2):
            try:
                u = self.used_mib()
            except (OSError, subprocess.TimeoutExpired, ValueError):
                continue
            if u is not None and (self.most is None or u > self.most):
                self.most = u

    def __exit__(self, *exc):
        if self.enabled:
            self.stop.set()
            self.thread.join()
            if self.base is not None and self.most is not None:
                self.peak = self.most - self.base
        return False


# ----------------------------------------------------------------------------------------------
# zaya

def run_cmd(cmd, env=None, timeout=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout, time.perf_counter() - t0


def shown(cmd):
    """A command line as the results record it: paths inside the repository relative to it."""
    return " ".join(str(c).replace(f"{ROOT}/", "") for c in cmd)


def grab(pattern, text, what, cast=float):
    m = re.search(pattern, text, re.M)
    if not m:
        raise RuntimeError(f"no {what} in the output (pattern {pattern!r}):\n{text}")
    return cast(m[1])


def zaya_bench(a, sets, zaya_device):
    """zaya bench step's timed run, then its parts of the step (--sections) in a run of its own."""
    env = dict(os.environ)
    base = [a.zaya, "bench", "step", "--init-config", a.config, "--seed", "1", "--device", zaya_device,
            "--batch", str(a.micro_batch), "--seq", str(a.seq), "--gemm-dtype", "bf16", "--param-dtype", "bf16",
            "--activation-dtype", "bf16", "--optimizer"]
    for s in sets:
        base += ["--set", s]
    with DriverMemory(zaya_device == "cuda") as mem:
        out, wall = run_cmd(base + ["--steps", str(a.steps)], env)
    r = parse_zaya_bench(out)
    r["driver_memory_mib"] = mem.peak
    r["wall_s"] = wall
    r["command"] = shown(base + ["--steps", str(a.steps)])
    if a.sections_steps > 0:
        env["CUDA_LAUNCH_BLOCKING"] = "1"  # so that the host's clock sees each kernel's end
        sec_out, _ = run_cmd(base + ["--steps", str(a.sections_steps), "--sections"], env)
        r["sections"] = parse_sections(sec_out)
        r["sections_step_ms"] = grab(r"^bench: forward [\d.]+ ms, backward [\d.]+ ms, step ([\d.]+) ms", sec_out,
                                     "sections run's step time")
    return r, out


def parse_zaya_bench(out):
    r = {
        "step_ms": grab(r"^bench: forward [\d.]+ ms, backward [\d.]+ ms, step ([\d.]+) ms", out, "step time"),
        "forward_ms": grab(r"^bench: forward ([\d.]+) ms", out, "forward time"),
        "backward_ms": grab(r"^bench: forward [\d.]+ ms, backward ([\d.]+) ms", out, "backward time"),
        "optimizer_ms": grab(r"^bench: optimizer ([\d.]+) ms per step", out, "optimizer time"),
        "tokens_per_s": grab(r"^bench: tokens/s ([\d.]+)", out, "tokens/s"),
        "flops_per_token": 1e9 * grab(r"^bench: model ([\d.]+) GFLOP per token", out, "model FLOPs per token"),
        "loss": grab(r"gemm \w+, loss ([\d.naninf-]+)", out, "loss"),
        "precision": grab(r"^bench: weights (.+)$", out, "precision line", str),
    }
    m = re.search(r"^bench: device memory: peak ([\d.]+) MiB of tensors", out, re.M)
    if m:
        r["peak_memory_mib"], r["peak_memory_kind"] = float(m[1]), "zaya's tensors on the device"
    else:
        r["peak_memory_mib"] = grab(r"^bench: memory: activation arena [\d.]+ MiB, peak RSS ([\d.]+) MiB", out,
                                    "peak memory")
        r["peak_memory_kind"] = "process peak RSS (CPU)"
    return r


def parse_sections(out):
    """The rows of bench step's parts table: name, ms per step, share of the parts' total."""
    rows = []
    for line in out.splitlines():
        m = re.match(r"^bench:   (\S.*?)\s+([\d.]+) ms\s+([\d.]+)%", line)
        if m and not line.startswith("bench:   part "):
            rows.append({"part": m[1], "ms": float(m[2]), "share": float(m[3]) / 100})
    if not rows:
        raise RuntimeError(f"no parts of the step in the --sections output:\n{out}")
    return rows


def zaya_size(a, sets, measured_step_s):
    cmd = [a.zaya, "size", "--model", a.config, "--mbs", str(a.micro_batch), "--seq", str(a.seq), "--hw",
           a.size_profile, "--measured-step-s", f"{measured_step_s:.6g}"]
    for s in sets:
        if s.startswith("model."):
            cmd += ["--set", s]
    out, _ = run_cmd(cmd)
    return {
        "command": shown(cmd),
        "flops_per_token": 1e9 * grab(r"^flops/token\s+([\d.]+) GFLOP", out, "zaya size's FLOPs per token"),
        "parameters": grab(r"^parameters\s+total [\d.]+B \((\d+)\)", out, "parameter count", int),
        "memory_gib": grab(r"^\s+total ([\d.]+) GiB", out, "predicted memory"),
        "predicted_step_s": grab(r"^measured\s+step [\d.e+-]+ s against ([\d.e+-]+) s predicted", out,
                                 "predicted step"),
        "measured_over_predicted": grab(r"\(measured / predicted ([\d.]+)\)", out, "measured / predicted"),
        "predicted_mfu": grab(r"mfu [\d.]+% measured, ([\d.]+)% predicted", out, "predicted MFU") / 100,
        "text": "\n".join(l for l in out.splitlines()
                          if l.startswith(("flops/token", "step time", "mfu ", "measured", "               mfu "))),
    }


# ----------------------------------------------------------------------------------------------
# transformers (a child process per mode: `--hf-worker MODE`)

def hf_worker(a):
    import torch
    from transformers import ZayaConfig, ZayaForCausalLM

    dev = torch.device(a.device)
    cfg = model_config(a.config, a.sets)
    torch.manual_seed(0)
    hc = ZayaConfig(**hf_config_kwargs(cfg))
    # Built on the device in bf16: an fp32 model of billions of parameters initialized on the host
    # first would take minutes of the run.
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = ZayaForCausalLM(hc)
    model = model.to(dtype=torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    g = torch.Generator().manual_seed(12345)
    ids = torch.randint(1, cfg["vocab_size"], (a.micro_batch, a.seq), generator=g).to(dev)
    compiled = a.hf_worker == "compile"
    fwd = torch.compile(model, backend=a.compile_backend) if compiled else model

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step():
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    # Warm-up: the compilation (and the caching allocator's first growth) happen here, timed apart.
    sync()
    t0 = time.perf_counter()
    for _ in range(a.hf_warmup):
        step()
    sync()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(a.hf_steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t0) / a.hf_steps
    r = {"step_ms": 1e3 * dt, "tokens_per_s": a.micro_batch * a.seq / dt, "warmup_s": warm,
         "warmup_steps": a.hf_warmup, "loss": float(loss), "attn_implementation": hc._attn_implementation,
         "experts_implementation": getattr(hc, "_experts_implementation", None),
         "parameters": sum(p.numel() for p in model.parameters()),
         "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    if compiled:
        r["compile_backend"] = a.compile_backend
    if dev.type == "cuda":
        r["peak_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
        r["peak_memory_kind"] = "torch.cuda.max_memory_allocated"
        r["reserved_memory_mib"] = torch.cuda.max_memory_reserved() / 2**20
    else:
        r["peak_memory_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        r["peak_memory_kind"] = "process peak RSS (CPU)"
    print(RESULT_PREFIX + json.dumps(r), flush=True)


def hf_run(a, mode):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--hf-worker", mode, "--device", a.device, "--config",
           a.config, "--micro-batch", str(a.micro_batch), "--seq", str(a.seq), "--hf-steps", str(a.hf_steps),
           "--hf-warmup", str(a.hf_warmup if mode == "eager" else a.compile_warmup), "--compile-backend",
           a.compile_backend]
    for s in a.sets:
        cmd += ["--set", s]
    try:
        with DriverMemory(a.device == "cuda") as mem:
            out, wall = run_cmd(cmd, timeout=a.hf_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within --hf-timeout {a.hf_timeout} s"}
    except RuntimeError as e:
        # Out of memory or a model transformers cannot run: reported in the table, not fatal.
        last = [l for l in str(e).splitlines() if l.strip()][-3:]
        return {"error": " / ".join(last)[-400:]}
    r = json.loads(out.splitlines()[-1][len(RESULT_PREFIX):])
    r["driver_memory_mib"] = mem.peak
    r["wall_s"] = wall
    return r


# ----------------------------------------------------------------------------------------------
# The report

def environment(a):
    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "device": a.device}
    if shutil.which("nvidia-smi") and a.device == "cuda":
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True)
        env["gpu"] = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None
    v = subprocess.run([a.zaya, "--version"], capture_output=True, text=True)
    for line in v.stdout.splitlines() if v.returncode == 0 else []:
        key, _, value = line.partition(" ")
        if key in ("version", "commit"):
            env[f"zaya_{key}"] = value.strip()
    return env


def fmt(x, spec, suffix=""):
    return "n/a" if x is None else format(x, spec) + suffix


def report(res):
    """The markdown tables of a result."""
    z, e, c, cfg = res["zaya"], res["hf_eager"], res["hf_compile"], res["config"]
    peak = res["peak_tflops"]
    mfu = z["tokens_per_s"] * z["flops_per_token"] / (peak * 1e12)
    L = ["## zaya against transformers on the same device", "",
         f"Model: hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layer"
         f"{'' if cfg['num_hidden_layers'] == 1 else 's'}, CCA {cfg['num_attention_heads']}/"
         f"{cfg['num_key_value_heads']} heads of {cfg['head_dim']}, {cfg['num_experts']} experts of "
         f"{cfg['moe_intermediate_size']} + skip, router {cfg['router_hidden_size']}, vocab {cfg['vocab_size']}; "
         f"batch {res['micro_batch']} x {res['seq']} tokens; device {res['env'].get('gpu') or res['env']['device']}.",
         f"zaya: {z['precision']}; transformers: bf16 parameters, torch AdamW. "
         f"Model FLOPs per token {z['flops_per_token'] / 1e9:.3f} G (zaya size's count); MFU against "
         f"{peak:g} TFLOP/s.",
         f"Run {res['env']['date_utc']} UTC; zaya {res['env'].get('zaya_version')} at commit "
         f"{res['env'].get('zaya_commit')}; torch {e.get('torch', c.get('torch', 'n/a'))}, transformers "
         f"{e.get('transformers', c.get('transformers', 'n/a'))}.", "",
         "| | zaya | transformers eager | transformers torch.compile |", "|---|---|---|---|"]

    def cell(r, key, spec, scale=1.0, suffix=""):
        if "error" in r:
            return "failed"
        v = r.get(key)
        return fmt(None if v is None else v * scale, spec, suffix)

    def mfu_of(r):
        return "failed" if "error" in r else f"{100 * r['tokens_per_s'] * z['flops_per_token'] / (peak * 1e12):.1f}%"

    L.append(f"| tokens/s | {z['tokens_per_s']:.0f} | {cell(e, 'tokens_per_s', '.0f')} | "
             f"{cell(c, 'tokens_per_s', '.0f')} |")
    L.append(f"| step | {z['step_ms']:.1f} ms | {cell(e, 'step_ms', '.1f', suffix=' ms')} | "
             f"{cell(c, 'step_ms', '.1f', suffix=' ms')} |")
    L.append(f"| MFU | {100 * mfu:.1f}% | {mfu_of(e)} | {mfu_of(c)} |")
    L.append(f"| peak memory (allocator) | {z['peak_memory_mib'] / 1024:.2f} GiB | "
             f"{cell(e, 'peak_memory_mib', '.2f', 1 / 1024, ' GiB')} | {cell(c, 'peak_memory_mib', '.2f', 1 / 1024, ' GiB')} |")
    L.append(f"| device memory used (nvidia-smi) | {cell(z, 'driver_memory_mib', '.2f', 1 / 1024, ' GiB')} | "
             f"{cell(e, 'driver_memory_mib', '.2f', 1 / 1024, ' GiB')} | {cell(c, 'driver_memory_mib', '.2f', 1 / 1024, ' GiB')} |")
    L.append(f"| warm-up / compilation | - | {cell(e, 'warmup_s', '.1f', suffix=' s')} | "
             f"{cell(c, 'warmup_s', '.1f', suffix=' s')} |")
    L.append(f"| loss (last step, random tokens) | {z['loss']:.3f} | {cell(e, 'loss', '.3f')} | {cell(c, 'loss', '.3f')} |")
    L.append("")
    L.append(f"Peak memory: zaya's is {z['peak_memory_kind']}; transformers' is "
             f"{e.get('peak_memory_kind', c.get('peak_memory_kind', 'n/a'))}.")
    for name, r in (("transformers eager", e), ("transformers torch.compile", c)):
        if "error" in r:
            L.append(f"{name} failed: {r['error']}")
    L += ["", "| goal | target | reached | met |", "|---|---|---|---|"]
    for g in goal_rows(res):
        L.append(f"| {g['goal']} | {g['target']} | {g['reached']} | {g['met']} |")
    s = res.get("size")
    if s:
        L += ["", f"`zaya size --hw {res['size_profile']}`: predicted step {s['predicted_step_s']:.4g} s, measured "
                  f"/ predicted {s['measured_over_predicted']:.2f}, predicted MFU {100 * s['predicted_mfu']:.1f}%, "
                  f"predicted memory {s['memory_gib']:.2f} GiB (bf16 weights and activations)."]
    if z.get("sections"):
        L += ["", f"### Where zaya's step goes ({res['sections_note']})", "", "| part | ms per step | share |",
              "|---|---|---|"]
        for row in z["sections"]:
            L.append(f"| {row['part']} | {row['ms']:.2f} | {100 * row['share']:.1f}% |")
    return "\n".join(L) + "\n"


def goal_rows(res):
    z, e, c = res["zaya"], res["hf_eager"], res["hf_compile"]
    mfu = z["tokens_per_s"] * z["flops_per_token"] / (res["peak_tflops"] * 1e12)
    rows = [{"goal": "MFU", "target": f">= {100 * GOALS['mfu']:.0f}%", "reached": f"{100 * mfu:.1f}%",
             "met": "yes" if mfu >= GOALS["mfu"] else "no", "value": mfu}]
    for key, name, r in (("vs_eager", "zaya / transformers eager (tokens/s)", e),
                         ("vs_compile", "zaya / transformers torch.compile (tokens/s)", c)):
        if "error" in r:
            rows.append({"goal": name, "target": f">= {GOALS[key]:g}x", "reached": "n/a (transformers failed)",
                         "met": "n/a", "value": None})
        else:
            v = z["tokens_per_s"] / r["tokens_per_s"]
            rows.append({"goal": name, "target": f">= {GOALS[key]:g}x", "reached": f"{v:.2f}x",
                         "met": "yes" if v >= GOALS[key] else "no", "value": v})
    return rows


def plot(res, path):
    """Where zaya's step goes: the parts of the --sections run as a bar chart of their shares."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(res["zaya"]["sections"], key=lambda r: r["share"])
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.6))
    colors = ["#4c72b0" if r["part"].startswith("forward") else "#dd8452" if r["part"].startswith("backward")
              else "#55a868" for r in rows]
    ax.barh([r["part"] for r in rows], [100 * r["share"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        ax.text(100 * r["share"], i, f" {100 * r['share']:.1f}%", va="center", fontsize=7)
    ax.set_xlim(0, 115 * max(r["share"] for r in rows))  # room for the labels
    ax.set_xlabel("share of the step (%)")
    cfg = res["config"]
    ax.set_title(f"zaya step on {res['env'].get('gpu') or res['env']['device']}: {cfg['num_hidden_layers']} layer"
                 f"{'' if cfg['num_hidden_layers'] == 1 else 's'}, "
                 f"{res['micro_batch']} x {res['seq']} tokens\n({res['sections_note']})", fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(res, out_dir, with_plot=True):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_train.json").write_text(json.dumps(res, indent=1) + "\n")
    (out_dir / "gpu_train.md").write_text(report(res))
    if with_plot and res["zaya"].get("sections"):
        plot(res, out_dir / "gpu_train_step.png")


def load_result(path):
    """A result from gpu_train.json or from a log holding a 'gpu_train: result' line (the last one)."""
    text = Path(path).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    lines = [l for l in text.splitlines() if l.startswith(RESULT_PREFIX)]
    if not lines:
        sys.exit(f"{path}: neither a result JSON nor a log with a '{RESULT_PREFIX.strip()}' line")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zaya", default=os.environ.get("ZAYA_BINARY", str(ROOT / "build/cuda/zaya")))
    ap.add_argument("--config", default=str(ROOT / "configs/zaya1-base.toml"), help="TOML with the [model] section")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override a config key (repeatable)")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (model.num_hidden_layers)")
    ap.add_argument("--micro-batch", type=int, default=1, help="sequences per step")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--zaya-device", choices=("cuda", "cpu"),
                    help="zaya's device when it differs from --device (the tests run zaya on the emulated device)")
    ap.add_argument("--zaya-muon", action="store_true",
                    help="zaya with ZAYA1's Muon + AdamW instead of AdamW alone (the transformers side's optimizer)")
    ap.add_argument("--steps", type=int, default=10, help="zaya's timed steps (after its untimed warm-up step)")
    ap.add_argument("--sections-steps", type=int, default=2, help="steps of the --sections run (0: none)")
    ap.add_argument("--hf-steps", type=int, default=5, help="transformers' timed steps per mode")
    ap.add_argument("--hf-warmup", type=int, default=2, help="transformers eager's untimed steps")
    ap.add_argument("--compile-warmup", type=int, default=3,
                    help="torch.compile's untimed steps (the compilation; timed apart)")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile run")
    ap.add_argument("--hf-timeout", type=float, default=900, help="seconds each transformers child may take")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="the MFU denominator: dense bf16 datasheet peak (H100/H200 SXM: 989)")
    ap.add_argument("--size-profile", default="h200", help="zaya size's --hw for the predicted step")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on the CPU (hidden 128, 2 layers, 64 tokens, a few steps): checks the script")
    ap.add_argument("--out", help="folder for gpu_train.json, gpu_train.md and gpu_train_step.png")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--replot", metavar="FILE",
                    help="rebuild the tables and the plot in --out from a gpu_train.json or a log with its result line")
    ap.add_argument("--hf-worker", choices=("eager", "compile"), help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.hf_worker:
        return hf_worker(a)
    # A SIGTERM (scripts/gpu_check.sh's timeout) becomes an exception inside subprocess.run, which
    # then kills the running child: no orphan keeps the GPU.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.replot:
        res = load_result(a.replot)
        if not a.out:
            sys.exit("--replot needs --out")
        write_outputs(res, a.out, not a.no_plot)
        print(report(res))
        return 0
    if a.smoke:
        a.device = "cpu" if a.device == "cuda" and "--device" not in sys.argv else a.device
        a.sets = SMOKE_SETS + a.sets
        if "--layers" not in sys.argv:
            a.layers = 2
        if "--seq" not in sys.argv:
            a.seq = 64
        if "--micro-batch" not in sys.argv:
            a.micro_batch = 2
        a.steps, a.hf_steps, a.hf_warmup, a.compile_warmup = min(a.steps, 2), min(a.hf_steps, 2), 1, 1
        if "--compile-backend" not in sys.argv:
            a.compile_backend = "eager"  # dynamo's tracing without inductor's code generation
    a.sets = a.sets + [f"model.num_hidden_layers={a.layers}"]
    zaya_device = a.zaya_device or a.device
    zsets = a.sets + ([] if a.zaya_muon else ["optim.muon=false"])
    cfg = model_config(a.config, a.sets)

    env = environment(a)
    print(f"gpu_train: {env}", flush=True)
    print(f"gpu_train: model {cfg}", flush=True)
    z, z_out = zaya_bench(a, zsets, zaya_device)
    print(z_out, end="", flush=True)
    print(f"gpu_train: zaya {z['tokens_per_s']:.0f} tokens/s, step {z['step_ms']:.1f} ms, peak "
          f"{z['peak_memory_mib'] / 1024:.2f} GiB", flush=True)
    size = zaya_size(a, a.sets, z["step_ms"] / 1e3)
    print(size["text"], flush=True)
    # zaya size prints GFLOP to 3 decimals: the two counts agree within half its last digit.
    if abs(size["flops_per_token"] - z["flops_per_token"]) > 0.5e6 + 1e-6 * z["flops_per_token"]:
        raise RuntimeError(f"bench step's FLOPs per token {z['flops_per_token']:.6g} differ from zaya size's "
                           f"{size['flops_per_token']:.6g}")
    e = hf_run(a, "eager")
    print(f"gpu_train: transformers eager {e}", flush=True)
    c = {"error": "skipped (--no-compile)"} if a.no_compile else hf_run(a, "compile")
    print(f"gpu_train: transformers torch.compile {c}", flush=True)
    note = ("parts timed under CUDA_LAUNCH_BLOCKING=1: shares of the step, not its time"
            if zaya_device == "cuda" else "parts timed on the CPU")
    res = {"config": cfg, "sets": a.sets, "micro_batch": a.micro_batch, "seq": a.seq, "peak_tflops": a.peak_tflops,
           "size_profile": a.size_profile, "zaya_optimizer": "Muon + AdamW" if a.zaya_muon else "AdamW",
           "env": env, "zaya": z, "size": size, "hf_eager": e, "hf_compile": c, "sections_note": note}
    res["goals"] = goal_rows(res)
    print(report(res), flush=True)
    if a.out:
        write_outputs(res, a.out, not a.no_plot)
        print(f"gpu_train: wrote {a.out}/gpu_train.json, gpu_train.md" + ("" if a.no_plot else ", gpu_train_step.png"))
    print(RESULT_PREFIX + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
