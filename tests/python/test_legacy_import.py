"""zaya's import of ZAYA1's LEGACY checkpoint layout (Zyphra's transformers fork, the layout of the
released ZAYA1-base) against an independent float64 NumPy implementation of the legacy forward pass.

The reference below is written from the fork's modeling code (models/zaya/modeling_zaya.py:
ZayaDecoderATTLayer, ZayaDecoderMLPLayer, ResidualScaling, CCA, ZayaRouter, ZayaBlock, ZayaModel),
in its own structure: 2L half-layers, each starting with its `res_scale` (hidden = (hidden + hb) *
hs; residual = (residual + rb) * rs, the latter absent in half-layer 0), then residual = hidden +
residual, `input_norm`, and the mixer; a final `model.res_scale` and `final_norm`. It reads the
checkpoint by its legacy names (per-expert `linear_fc1`/`linear_fc2`, `conv_qk.0/1`, `router_mlp.0/2/4`,
...) and shares nothing with zaya's name mapping: a wrong rename, a residual scale moved one
half-layer off, an expert stacked out of order or a gate/up swap changes the logits at the 1e-2
level or more.

Tolerances: zaya computes in fp32 and the reference in float64 on the same stored weights, so the
logits agree to fp32 rounding through a few layers (~1e-6 relative); the contract is 1e-5 relative
(norm-wise, and the largest element error relative to the largest logit). transformers' native
ZayaForCausalLM, run in float64 on zaya's f32 export of the imported model, must agree with the
float64 reference to 1e-6: the weights are copied bit for bit, but transformers computes RoPE's
cos/sin in float32 even in a float64 model (its rotary embedding forces float32), which leaves
~2e-7 relative.

Run: ZAYA_BINARY=build/cuda/zaya .venv/bin/python -m pytest tests/python/test_legacy_import.py
"""
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from zaya_bin import zaya_binary  # noqa: E402


def run_zaya(*args):
    return subprocess.run([zaya_binary(), *map(str, args)], capture_output=True, text=True, check=True)


# ---------------------------------------------------------------------------------------------
# A legacy-layout checkpoint: config.json with the fork's keys, tensors with the fork's names.
# ---------------------------------------------------------------------------------------------

# (H, nq, nkv, hd, E, L, R, I, V, seed)
CASES = {
    "nq4nkv2hd16E4L3": (32, 4, 2, 16, 4, 3, 8, 24, 96, 1),
    "nq2nkv1hd32E2L2": (48, 2, 1, 32, 2, 2, 8, 16, 64, 2),
}


def legacy_config(H, nq, nkv, hd, E, L, R, I, V):
    halves = 2 * L
    return {
        "architectures": ["ZayaForCausalLM"],
        "model_type": "zaya",
        "cca": True,
        "zaya_layers": ["a" if n % 2 == 0 else E for n in range(halves)],
        "num_hidden_layers": halves,
        "cca_num_q_heads": [nq if n % 2 == 0 else 0 for n in range(halves)],
        "num_query_groups_list": [nkv if n % 2 == 0 else 0 for n in range(halves)],
        "ffn_hidden_size_list": [0 if n % 2 == 0 else 2 * I for n in range(halves)],
        "zaya_mlp_expansion": [0 if n % 2 == 0 else R for n in range(halves)],
        "num_attention_heads": 2 * nq,
        "num_key_value_heads": nkv,
        "kv_channels": hd,
        "num_experts": E,
        "hidden_size": H,
        "vocab_size": V,
        "max_position_embeddings": 256,
        "norm_epsilon": 1e-5,
        "rope_theta": 1000.0,
        "partial_rotary_factor": 0.5,
        "rope_scaling": False,
        "moe_router_topk": 1,
        "activation_func": "swiglu",
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "attention_bias": False,
        "lm_head_bias": False,
        "scale_residual_merge": True,
        "residual_in_fp32": True,
        "zaya_use_mod": True,
        "zaya_use_eda": True,
        "zaya_high_prec": True,
        "normalization": "RMSNorm",
        "sliding_window": None,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 1,
    }


def legacy_weights(H, nq, nkv, hd, E, L, R, I, V, seed, skip_can_win=False):
    """Random weights under legacy names, every one away from its trivial init."""
    g = np.random.default_rng(seed)
    W = {}

    def mat(name, rows, cols, gain=1.0):
        W[name] = g.standard_normal((rows, cols)) * (gain / math.sqrt(cols))

    def vec(name, n, kind):
        if kind == "scale":
            W[name] = 0.6 + 0.8 * g.random(n)
        else:
            W[name] = 0.1 * g.standard_normal(n)

    def res_scale(prefix, with_residual):
        vec(prefix + "hidden_states_scale", H, "scale")
        vec(prefix + "hidden_states_bias", H, "bias")
        if with_residual:
            vec(prefix + "residual_scale", H, "scale")
            vec(prefix + "residual_bias", H, "bias")

    C = (nq + nkv) * hd
    W["model.embed_tokens.weight"] = g.standard_normal((V, H)) / math.sqrt(H)
    for n in range(2 * L):
        p = f"model.layers.{n}."
        res_scale(p + "res_scale.", with_residual=n != 0)
        vec(p + "input_norm.weight", H, "scale")
        if n % 2 == 0:
            a = p + "self_attn."
            mat(a + "qkv.linear_q.weight", nq * hd, H)
            mat(a + "qkv.linear_k.weight", nkv * hd, H)
            mat(a + "qkv.val_proj1.weight", nkv * hd // 2, H)
            mat(a + "qkv.val_proj2.weight", nkv * hd // 2, H)
            W[a + "qkv.conv_qk.0.weight"] = g.standard_normal((C, 1, 2)) * 0.7
            vec(a + "qkv.conv_qk.0.bias", C, "bias")
            W[a + "qkv.conv_qk.1.weight"] = g.standard_normal((C, hd, 2)) / math.sqrt(2 * hd)
            vec(a + "qkv.conv_qk.1.bias", C, "bias")
            W[a + "qkv.temp"] = 0.5 + g.random(nkv)
            mat(a + "o_proj.weight", H, nq * hd)
        else:
            r = p + "zaya_block.router."
            mat(r + "down_proj.weight", R, H)
            vec(r + "down_proj.bias", R, "bias")
            if n != 1:  # the fork's use_eda: every MoE half-layer but the first
                vec(r + "router_states_scale", R, "scale")
            vec(r + "rmsnorm_eda.weight", R, "scale")
            mat(r + "router_mlp.0.weight", R, R, 3.0)
            vec(r + "router_mlp.0.bias", R, "bias")
            mat(r + "router_mlp.2.weight", R, R, 3.0)
            vec(r + "router_mlp.2.bias", R, "bias")
            mat(r + "router_mlp.4.weight", E + 1, R, 3.0)
            bb = np.zeros(E + 1)
            bb[:E] = 0.05 * np.abs(g.standard_normal(E))
            # The fork's init (-1) keeps the skip class from ever winning while a real expert's bias
            # is >= 0; +0.02 lets it win for some tokens.
            bb[E] = 0.02 if skip_can_win else -1.0
            W[r + "balancing_biases"] = bb
            for e in range(E):
                x = p + f"zaya_block.experts.local_experts.{e}."
                mat(x + "linear_fc1.weight", 2 * I, H)
                mat(x + "linear_fc2.weight", H, I)
    res_scale("model.res_scale.", with_residual=True)
    vec("model.final_norm.weight", H, "scale")
    return W


def bf16_round(x):
    """float64 -> the float64 value of its round-to-nearest-even bfloat16."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def f32_to_bf16_bits(x):
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16)).astype(np.uint16)


def write_legacy_dir(d, cfg, W, dtype="f32", shards=1):
    """Writes config.json and the tensors; returns the weights as stored (float64 of f32/bf16)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    stored = {}
    arrays = {}
    for name, w in W.items():
        if name.endswith("balancing_biases") or dtype == "f32":
            arrays[name] = np.ascontiguousarray(w, dtype=np.float32)  # the fork keeps these buffers fp32
            stored[name] = arrays[name].astype(np.float64)
        else:
            # safetensors.numpy has no bfloat16: write the bits, then relabel the dtype in the header.
            arrays[name] = f32_to_bf16_bits(w)
            stored[name] = bf16_round(w)
    names = list(arrays)
    if shards == 1:
        files = {"model.safetensors": names}
    else:
        per = (len(names) + shards - 1) // shards
        files = {f"model-{k + 1:05d}-of-{shards:05d}.safetensors": names[k * per:(k + 1) * per] for k in range(shards)}
    for fname, part in files.items():
        save_file({n: arrays[n] for n in part}, str(d / fname), metadata={"format": "pt"})
        if dtype == "bf16":
            relabel_u16_as_bf16(d / fname)
    if shards > 1:
        index = {"metadata": {"total_size": sum(a.nbytes for a in arrays.values())},
                 "weight_map": {n: f for f, part in files.items() for n in part}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return stored


def relabel_u16_as_bf16(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for k, v in header.items():
        if k != "__metadata__" and v["dtype"] == "U16":
            v["dtype"] = "BF16"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


# ---------------------------------------------------------------------------------------------
# The legacy forward pass in float64, after the fork's modeling code.
# ---------------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def cca_attention(hs, W, a, cfg):
    """ZayaAttention + CCA on one sequence hs [T, H] (no cache, no mask)."""
    T = hs.shape[0]
    nq, nkv, hd = cfg["cca_num_q_heads"][0], cfg["num_query_groups_list"][0], cfg["kv_channels"]
    G = nq // nkv
    q = hs @ W[a + "qkv.linear_q.weight"].T
    k = hs @ W[a + "qkv.linear_k.weight"].T
    qk = np.concatenate([q, k], axis=-1)  # [T, C]
    query_pre = q.reshape(T, nq, hd)
    key_pre = np.repeat(k.reshape(T, nkv, hd), G, axis=1)  # kv head j serves query heads jG..jG+G-1
    mean_q = (query_pre + key_pre) / 2
    mean_k = mean_q.reshape(T, nkv, G, hd).mean(axis=2)
    # conv_qk: pad the sequence on the left by (time0-1)+(time1-1) = 2 once, then two unpadded
    # kernel-2 Conv1d (cross-correlation): depthwise, then one group per head.
    z = np.concatenate([np.zeros((2, qk.shape[1])), qk], axis=0)  # [T+2, C]
    w0, b0 = W[a + "qkv.conv_qk.0.weight"], W[a + "qkv.conv_qk.0.bias"]
    y0 = z[:-1] * w0[:, 0, 0] + z[1:] * w0[:, 0, 1] + b0  # [T+1, C]
    w1, b1 = W[a + "qkv.conv_qk.1.weight"], W[a + "qkv.conv_qk.1.bias"]
    y1 = np.empty((T, qk.shape[1]))
    for h in range(nq + nkv):
        sl = slice(h * hd, (h + 1) * hd)
        y1[:, sl] = y0[:-1, sl] @ w1[sl, :, 0].T + y0[1:, sl] @ w1[sl, :, 1].T + b1[sl]
    query = y1[:, :nq * hd].reshape(T, nq, hd) + mean_q
    key = y1[:, nq * hd:].reshape(T, nkv, hd) + mean_k
    v1 = hs @ W[a + "qkv.val_proj1.weight"].T
    hs_d = np.concatenate([np.zeros((1, hs.shape[1])), hs[:-1]], axis=0)  # the previous token's input
    v2 = hs_d @ W[a + "qkv.val_proj2.weight"].T
    value = np.concatenate([v1, v2], axis=-1).reshape(T, nkv, hd)
    query = query * (math.sqrt(hd) / np.linalg.norm(query, axis=-1, keepdims=True))
    key = key * (math.sqrt(hd) / np.linalg.norm(key, axis=-1, keepdims=True)) * W[a + "qkv.temp"][None, :, None]
    # Partial RoPE (rotate-half) on the first rot dims of each head.
    rot = int(hd * cfg["partial_rotary_factor"])
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, rot, 2) / rot))
    freqs = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([freqs, freqs], -1)), np.sin(np.concatenate([freqs, freqs], -1))

    def rope(x):
        xr, xp = x[..., :rot], x[..., rot:]
        half = np.concatenate([-xr[..., rot // 2:], xr[..., :rot // 2]], axis=-1)
        return np.concatenate([xr * cos[:, None, :] + half * sin[:, None, :], xp], axis=-1)

    query, key = rope(query), rope(key)
    out = np.empty((T, nq, hd))
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for h in range(nq):
        j = h // G
        s = query[:, h] @ key[:, j].T / math.sqrt(hd) + mask
        out[:, h] = softmax(s) @ value[:, j]
    return out.reshape(T, nq * hd) @ W[a + "o_proj.weight"].T


def zaya_block(hs, W, p, n, prev_router, cfg, skip_passthrough):
    """ZayaBlock: router (down-projection, EDA, RMSNorm, 3-layer MLP, biased top-1) and experts."""
    r = p + "zaya_block.router."
    E = cfg["zaya_layers"][1]
    h = hs @ W[r + "down_proj.weight"].T + W[r + "down_proj.bias"]
    if n != 1 and prev_router is not None:  # use_eda: layer_number != zaya_first_layer (1)
        h = h + prev_router * W[r + "router_states_scale"]
    router_next = h
    hn = rmsnorm(h, W[r + "rmsnorm_eda.weight"], cfg["norm_epsilon"])
    x = gelu(hn @ W[r + "router_mlp.0.weight"].T + W[r + "router_mlp.0.bias"])
    x = gelu(x @ W[r + "router_mlp.2.weight"].T + W[r + "router_mlp.2.bias"])
    prob = softmax(x @ W[r + "router_mlp.4.weight"].T)
    choice = np.argmax(prob + W[r + "balancing_biases"], axis=-1)
    out = np.zeros_like(hs)
    for t, e in enumerate(choice):
        if e == E:  # MOD skip: the fork passes the (normalized) input through
            y = hs[t] if skip_passthrough else np.zeros_like(hs[t])
        else:
            x1 = W[p + f"zaya_block.experts.local_experts.{e}.linear_fc1.weight"] @ hs[t]
            g, u = np.split(x1, 2)
            y = W[p + f"zaya_block.experts.local_experts.{e}.linear_fc2.weight"] @ (silu(g) * u)
        out[t] = prob[t, e] * y
    return out, router_next, choice


def legacy_forward(W, cfg, ids, skip_passthrough=True):
    """Logits [T, V] and the per-MoE-half-layer expert choices."""
    eps = cfg["norm_epsilon"]
    hidden = W["model.embed_tokens.weight"][ids]
    residual = None
    prev_router = None
    choices = []

    def res_scale(prefix, residual, hidden):
        hidden = (hidden + W[prefix + "hidden_states_bias"]) * W[prefix + "hidden_states_scale"]
        if residual is not None:  # ResidualScaling.not_first_layer; half-layer 0 has no residual
            residual = (residual + W[prefix + "residual_bias"]) * W[prefix + "residual_scale"]
        return residual, hidden

    for n in range(len(cfg["zaya_layers"])):
        p = f"model.layers.{n}."
        residual, hidden = res_scale(p + "res_scale.", residual, hidden)
        residual = hidden if residual is None else hidden + residual
        x = rmsnorm(residual, W[p + "input_norm.weight"], eps)
        if n % 2 == 0:
            hidden = cca_attention(x, W, p + "self_attn.", cfg)
        else:
            hidden, prev_router, ch = zaya_block(x, W, p, n, prev_router, cfg, skip_passthrough)
            choices.append(ch)
    residual, hidden = res_scale("model.res_scale.", residual, hidden)
    out = rmsnorm(hidden + residual, W["model.final_norm.weight"], eps)
    return out @ W["model.embed_tokens.weight"].T, choices


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def elem_rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def zaya_logits(model_dir, ids, tmp_path):
    out = tmp_path / "logits.npy"
    res = run_zaya("forward", "--model", model_dir, "--ids", ",".join(map(str, ids)), "--out", out)
    return np.load(out).astype(np.float64), res


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,dtype,shards", [("nq4nkv2hd16E4L3", "f32", 1), ("nq2nkv1hd32E2L2", "bf16", 3)],
                         ids=["f32-single", "bf16-sharded"])
def test_import_matches_legacy_forward(case, dtype, shards, tmp_path):
    H, nq, nkv, hd, E, L, R, I, V, seed = CASES[case]
    cfg = legacy_config(H, nq, nkv, hd, E, L, R, I, V)
    W = write_legacy_dir(tmp_path / "legacy", cfg, legacy_weights(H, nq, nkv, hd, E, L, R, I, V, seed), dtype, shards)
    ids = np.random.default_rng(seed + 7).integers(1, V, 23)
    ref, choices = legacy_forward(W, cfg, ids)
    # The case must exercise routing: at least two real experts chosen, and the skip class never.
    used = set(np.concatenate(choices).tolist())
    assert len(used) >= 2 and E not in used, used

    logits, _ = zaya_logits(tmp_path / "legacy", ids, tmp_path)
    assert logits.shape == ref.shape
    assert rel(logits, ref) <= 1e-5, rel(logits, ref)
    assert elem_rel(logits, ref) <= 1e-5, elem_rel(logits, ref)


def test_greedy_tokens_match_legacy_forward(tmp_path):
    H, nq, nkv, hd, E, L, R, I, V, seed = CASES["nq4nkv2hd16E4L3"]
    cfg = legacy_config(H, nq, nkv, hd, E, L, R, I, V)
    W = write_legacy_dir(tmp_path / "legacy", cfg, legacy_weights(H, nq, nkv, hd, E, L, R, I, V, seed + 20))
    seq = list(np.random.default_rng(seed + 11).integers(1, V, 5))
    gaps = []
    for _ in range(16):  # the reference recomputes the whole sequence per token: no cache to share
        logits, _ = legacy_forward(W, cfg, np.array(seq))
        top2 = np.sort(logits[-1])[-2:]
        gaps.append(top2[1] - top2[0])
        seq.append(int(np.argmax(logits[-1])))
    ref = seq[5:]
    res = run_zaya("generate", "--model", tmp_path / "legacy", "--prompt-ids", ",".join(map(str, seq[:5])),
                   "--max-new", 16, "--greedy", "--ignore-eos")
    got = [int(t) for t in res.stdout.strip().split(",")]
    assert got == ref, f"min top-2 logit gap {min(gaps):.3g}"
    assert len(set(ref)) > 1, "a constant sequence would not test the cache"


def skip_case(tmp_path):
    """A legacy directory whose balancing biases let the skip class win, ids for which it does."""
    H, nq, nkv, hd, E, L, R, I, V, seed = CASES["nq4nkv2hd16E4L3"]
    cfg = legacy_config(H, nq, nkv, hd, E, L, R, I, V)
    W = write_legacy_dir(tmp_path / "legacy", cfg,
                         legacy_weights(H, nq, nkv, hd, E, L, R, I, V, seed + 3, skip_can_win=True))
    ids = np.random.default_rng(seed + 8).integers(1, V, 23)
    return cfg, W, ids, E, V


def test_skip_class_passes_through_as_in_the_legacy_forward(tmp_path):
    """Where the skip class wins, the legacy model's MoE outputs p_skip times the token's normalized
    input: zaya's import (skip_passthrough on) gives the legacy forward's logits and greedy tokens,
    with no warning."""
    cfg, W, ids, E, V = skip_case(tmp_path)
    passthrough, choices = legacy_forward(W, cfg, ids)
    zeroed, _ = legacy_forward(W, cfg, ids, skip_passthrough=False)
    skipped = int(sum((c == E).sum() for c in choices))
    assert 0 < skipped < sum(len(c) for c in choices), "the skip class must win for some tokens, not all"
    assert rel(passthrough, zeroed) > 1e-3  # the skip term moves the logits: the check below means something
    logits, res = zaya_logits(tmp_path / "legacy", ids, tmp_path)
    assert rel(logits, passthrough) <= 1e-5, rel(logits, passthrough)
    assert elem_rel(logits, passthrough) <= 1e-5, elem_rel(logits, passthrough)
    assert "skip class" not in res.stderr, res.stderr

    seq = list(ids[:5])
    for _ in range(8):  # greedy decoding through the cached decode path, skip class included
        step, ch = legacy_forward(W, cfg, np.array(seq))
        seq.append(int(np.argmax(step[-1])))
    assert any((c == E).any() for c in ch)
    res = run_zaya("generate", "--model", tmp_path / "legacy", "--prompt-ids", ",".join(map(str, seq[:5])),
                   "--max-new", 8, "--greedy", "--ignore-eos")
    assert [int(t) for t in res.stdout.strip().split(",")] == seq[5:]


def test_skip_class_export_warns_and_the_option_off_model_gives_the_native_zero(tmp_path):
    """export-hf of the imported model warns that transformers' native model differs where the skip
    class wins, and keeps skip_passthrough in config.json (zaya reads it back). Without it (zaya's
    option off, the native behaviour) a skipped token's MoE output is 0: the legacy forward with the
    skip term zeroed. transformers' ZayaForCausalLM goes further: its _init_weights, which
    from_pretrained runs after loading, writes balancing_biases[-1] = -1 past the loaded value, so in
    it the skip class never wins here and those tokens go to their best real expert (checked as the
    legacy forward with every skip bias at -1)."""
    cfg, W, ids, E, V = skip_case(tmp_path)
    passthrough, _ = legacy_forward(W, cfg, ids)
    zeroed, _ = legacy_forward(W, cfg, ids, skip_passthrough=False)
    run_zaya("ckpt", "import-hf", tmp_path / "legacy", "--out", tmp_path / "run")
    res = run_zaya("ckpt", "export-hf", tmp_path / "run", "--out", tmp_path / "native", "--no-tokenizer")
    assert "OUTPUTS WILL DIFFER" in res.stderr and "skip class" in res.stderr, res.stderr
    config = json.loads((tmp_path / "native" / "config.json").read_text())
    assert config["skip_passthrough"] is True
    logits, _ = zaya_logits(tmp_path / "native", ids, tmp_path)
    assert rel(logits, passthrough) <= 1e-5, rel(logits, passthrough)

    del config["skip_passthrough"]
    (tmp_path / "native" / "config.json").write_text(json.dumps(config))
    logits, _ = zaya_logits(tmp_path / "native", ids, tmp_path)
    assert rel(logits, zeroed) <= 1e-5, rel(logits, zeroed)
    assert rel(logits, passthrough) > 1e-3

    try:
        import torch
        import transformers
    except ImportError:
        return
    model = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "native", torch_dtype=torch.float32)
    model = model.double().eval()
    model.config._experts_implementation = "eager"
    with torch.no_grad():
        got = model(input_ids=torch.tensor(ids)[None]).logits[0].numpy()
    E_ = cfg["zaya_layers"][1]
    kept = [float(model.model.layers[l].mlp.gate.balancing_biases[E_]) for l in range(len(model.model.layers))]
    if all(b == -1.0 for b in kept):  # transformers replaced the loaded skip bias 0.02 by its init -1
        W_init = dict(W)
        for n in range(1, len(cfg["zaya_layers"]), 2):
            bb = W[f"model.layers.{n}.zaya_block.router.balancing_biases"].copy()
            bb[E_] = -1.0
            W_init[f"model.layers.{n}.zaya_block.router.balancing_biases"] = bb
        want, _ = legacy_forward(W_init, cfg, ids, skip_passthrough=False)
    else:  # a transformers that keeps the loaded biases: the native zero output
        want = zeroed
    assert rel(got, want) <= 1e-6, (rel(got, want), kept)


def test_import_export_loads_in_native_transformers(tmp_path):
    """import-hf of the legacy directory, export-hf of the result: transformers' native
    ZayaForCausalLM loads it and gives the legacy model's logits (float64 on both sides)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    H, nq, nkv, hd, E, L, R, I, V, seed = CASES["nq4nkv2hd16E4L3"]
    cfg = legacy_config(H, nq, nkv, hd, E, L, R, I, V)
    W = write_legacy_dir(tmp_path / "legacy", cfg, legacy_weights(H, nq, nkv, hd, E, L, R, I, V, seed + 5))
    run_zaya("ckpt", "import-hf", tmp_path / "legacy", "--out", tmp_path / "run")
    run_zaya("ckpt", "export-hf", tmp_path / "run", "--out", tmp_path / "native", "--no-tokenizer")
    model = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "native", torch_dtype=torch.float32)
    model = model.double().eval()
    model.config._experts_implementation = "eager"
    ids = np.random.default_rng(seed + 9).integers(1, V, 19)
    with torch.no_grad():
        got = model(input_ids=torch.tensor(ids)[None]).logits[0].numpy()
    ref, _ = legacy_forward(W, cfg, ids)
    assert rel(got, ref) <= 1e-6, rel(got, ref)


def test_bad_legacy_inputs_are_named(tmp_path):
    H, nq, nkv, hd, E, L, R, I, V, seed = CASES["nq2nkv1hd32E2L2"]
    good = legacy_config(H, nq, nkv, hd, E, L, R, I, V)
    W = legacy_weights(H, nq, nkv, hd, E, L, R, I, V, seed)

    def import_error(cfg, weights, name):
        d = tmp_path / name
        write_legacy_dir(d, cfg, weights)
        res = subprocess.run([zaya_binary(), "ckpt", "import-hf", str(d), "--out", str(tmp_path / (name + "-run"))],
                             capture_output=True, text=True)
        assert res.returncode == 2, res.stdout + res.stderr
        return res.stderr

    cfg = dict(good, swa_layers=[64] + [0] * (2 * L - 1))
    assert "swa_layers[0]" in import_error(cfg, W, "swa")
    assert "sliding_window" in import_error(dict(good, sliding_window=128), W, "window")
    assert "moe_router_topk" in import_error(dict(good, moe_router_topk=2), W, "topk")
    heads = list(good["cca_num_q_heads"])
    heads[2] = 4
    assert "cca_num_q_heads[2]" in import_error(dict(good, cca_num_q_heads=heads), W, "heads")
    # A tensor the legacy model never creates: half-layer 0's residual scale.
    extra = dict(W, **{"model.layers.0.res_scale.residual_scale": np.ones(H)})
    assert "model.layers.0.res_scale.residual_scale" in import_error(good, extra, "leftover")
    missing = {k: v for k, v in W.items() if k != "model.layers.1.zaya_block.experts.local_experts.1.linear_fc2.weight"}
    err = import_error(good, missing, "missing")
    assert "local_experts.1.linear_fc2.weight" in err and "down_proj[1]" in err


# ZAYA1-base's shapes in its legacy config.json: 80 half-layers, 8 query and 2 key/value heads of
# 128 on every attention half-layer, 16 experts with fc1 4096 wide (gate + up) and a 256-wide
# router on every MoE half-layer, vocabulary 262,272 (docs/legacy-import.md cites the sources).
def test_size_of_zaya1_base_legacy_config(tmp_path):
    halves = 80
    cfg = legacy_config(H=2048, nq=8, nkv=2, hd=128, E=16, L=40, R=256, I=2048, V=262272)
    cfg.update(num_attention_heads=8, rope_theta=10000, max_position_embeddings=4096,
               zaya_mlp_expansion=256, num_hidden_layers=halves)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps(cfg))
    out = run_zaya("size", "--model", tmp_path / "base").stdout
    assert "non-embedding 8.303B" in out, out
    assert "active 0.754B" in out, out
    assert "embedding 0.537B" in out, out


def write_indexed_dataset(prefix, ids):
    """One document as a Megatron indexed dataset (uint16 ids; docs/data.md, "Indexed dataset format")."""
    ids = np.asarray(ids, dtype=np.uint16)
    Path(str(prefix) + ".bin").write_bytes(ids.tobytes())
    idx = b"MMIDIDX\x00\x00" + np.uint64(1).tobytes() + np.uint8(8).tobytes()
    idx += np.uint64(1).tobytes() + np.uint64(2).tobytes()  # 1 sequence, document index [0, 1]
    idx += np.int32(len(ids)).tobytes() + np.int64(0).tobytes() + np.array([0, 1], dtype=np.int64).tobytes()
    Path(str(prefix) + ".idx").write_bytes(idx)


def test_train_init_from_a_legacy_directory(tmp_path):
    """train.init_from = a legacy directory: the first step's loss (before its update) is the legacy
    model's mean next-token cross-entropy on the one sample the dataset holds."""
    H, nq, nkv, hd, E, L, R, I, V, seed = CASES["nq4nkv2hd16E4L3"]
    cfg = legacy_config(H, nq, nkv, hd, E, L, R, I, V)
    W = write_legacy_dir(tmp_path / "legacy", cfg, legacy_weights(H, nq, nkv, hd, E, L, R, I, V, seed + 30))
    T = 24
    ids = np.random.default_rng(seed + 31).integers(1, V, T + 1)
    write_indexed_dataset(tmp_path / "one", ids)
    (tmp_path / "run.toml").write_text(f"""
[model]
vocab_size = {V}
hidden_size = {H}
num_hidden_layers = {L}
num_attention_heads = {nq}
num_key_value_heads = {nkv}
head_dim = {hd}
num_experts = {E}
moe_intermediate_size = {I}
router_hidden_size = {R}
rope_theta = 1000.0
max_position_embeddings = 256
skip_passthrough = true
[data]
train = ["{tmp_path / 'one'}"]
[train]
steps = 1
micro_batch = 1
seq_len = {T}
eval_every = 0
progress = false
out_dir = "{tmp_path / 'run'}"
init_from = "{tmp_path / 'legacy'}"
""")
    run_zaya("train", "--config", tmp_path / "run.toml")
    loss = [json.loads(l)["loss"] for l in open(tmp_path / "run" / "metrics.jsonl") if '"loss"' in l][0]
    logits, _ = legacy_forward(W, cfg, ids[:-1])
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    ref = -np.mean(logp[np.arange(T), ids[1:]])
    assert abs(loss - ref) <= 1e-5 * ref, (loss, ref)  # fp32 loss against float64, as the logits
    assert abs(ref - math.log(V)) > 0.1, ref  # far from what random weights would give
