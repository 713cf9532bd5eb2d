#!/usr/bin/env python3
"""Rewrites a native-layout ZAYA1 transformers directory (what `zaya ckpt export-hf` writes) in the
LEGACY layout of Zyphra's transformers fork (the layout of the released ZAYA1-base), so that the
continue-pretraining demo (benchmarks/legacy_continue.sh) can start from a legacy-layout model of
demo size. It is the inverse of zaya's import (src/zaya/ckpt/hf_legacy.cc), written separately:
layer i becomes half-layers 2i (attention) and 2i+1 (MoE); the stacked experts are split into
per-expert linear_fc1/linear_fc2; the input scale/bias become half-layer 0's res_scale, layer i's
post-attention scale half-layer 2i+1's, its post-MLP scale half-layer 2i+2's (the last one
model.res_scale); the final norm becomes final_norm.

  benchmarks/native_to_legacy.py NATIVE_DIR LEGACY_DIR
"""
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

ATTN = {
    "input_layernorm.weight": "input_norm.weight",
    "self_attn.qkv_proj.q_proj.weight": "self_attn.qkv.linear_q.weight",
    "self_attn.qkv_proj.k_proj.weight": "self_attn.qkv.linear_k.weight",
    "self_attn.qkv_proj.v_proj_current.weight": "self_attn.qkv.val_proj1.weight",
    "self_attn.qkv_proj.v_proj_delayed.weight": "self_attn.qkv.val_proj2.weight",
    "self_attn.qkv_proj.conv_qk_depthwise.weight": "self_attn.qkv.conv_qk.0.weight",
    "self_attn.qkv_proj.conv_qk_depthwise.bias": "self_attn.qkv.conv_qk.0.bias",
    "self_attn.qkv_proj.conv_qk_grouped.weight": "self_attn.qkv.conv_qk.1.weight",
    "self_attn.qkv_proj.conv_qk_grouped.bias": "self_attn.qkv.conv_qk.1.bias",
    "self_attn.qk_norm.temp": "self_attn.qkv.temp",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
}
MOE = {
    "post_attention_layernorm.weight": "input_norm.weight",
    "mlp.gate.down_proj.weight": "zaya_block.router.down_proj.weight",
    "mlp.gate.down_proj.bias": "zaya_block.router.down_proj.bias",
    "mlp.gate.router_states_scale": "zaya_block.router.router_states_scale",
    "mlp.gate.router_mlp.norm.weight": "zaya_block.router.rmsnorm_eda.weight",
    "mlp.gate.router_mlp.fc1.weight": "zaya_block.router.router_mlp.0.weight",
    "mlp.gate.router_mlp.fc1.bias": "zaya_block.router.router_mlp.0.bias",
    "mlp.gate.router_mlp.fc2.weight": "zaya_block.router.router_mlp.2.weight",
    "mlp.gate.router_mlp.fc2.bias": "zaya_block.router.router_mlp.2.bias",
    "mlp.gate.router_mlp.out_proj.weight": "zaya_block.router.router_mlp.4.weight",
    "mlp.gate.balancing_biases": "zaya_block.router.balancing_biases",
}


def main(native, legacy):
    native, legacy = Path(native), Path(legacy)
    c = json.loads((native / "config.json").read_text())
    L, E = c["num_hidden_layers"], c["num_experts"]
    rope = c.get("rope_parameters", {}).get("hybrid", {})
    halves = 2 * L
    cfg = {
        "architectures": ["ZayaForCausalLM"], "model_type": "zaya", "cca": True,
        "zaya_layers": ["a" if n % 2 == 0 else E for n in range(halves)], "num_hidden_layers": halves,
        "cca_num_q_heads": [c["num_attention_heads"] if n % 2 == 0 else 0 for n in range(halves)],
        "num_query_groups_list": [c["num_key_value_heads"] if n % 2 == 0 else 0 for n in range(halves)],
        "ffn_hidden_size_list": [0 if n % 2 == 0 else 2 * c["moe_intermediate_size"] for n in range(halves)],
        "zaya_mlp_expansion": [0 if n % 2 == 0 else c["router_hidden_size"] for n in range(halves)],
        "num_attention_heads": 2 * c["num_attention_heads"], "num_key_value_heads": c["num_key_value_heads"],
        "kv_channels": c["head_dim"], "num_experts": E, "hidden_size": c["hidden_size"],
        "vocab_size": c["vocab_size"], "max_position_embeddings": c["max_position_embeddings"],
        "norm_epsilon": c["rms_norm_eps"], "initializer_range": c["initializer_range"],
        "rope_theta": rope.get("rope_theta", 10000.0), "partial_rotary_factor": rope.get("partial_rotary_factor", 0.5),
        "rope_scaling": False, "moe_router_topk": 1, "activation_func": "swiglu", "gated_linear_unit": True,
        "add_bias_linear": False, "attention_bias": False, "lm_head_bias": False, "scale_residual_merge": True,
        "residual_in_fp32": True, "zaya_use_mod": True, "zaya_use_eda": True, "normalization": "RMSNorm",
        "sliding_window": None, "tie_word_embeddings": True, "pad_token_id": c["pad_token_id"],
        "bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"],
    }
    W = {}
    files = [native / "model.safetensors"] if (native / "model.safetensors").exists() else sorted(
        {native / f for f in json.loads((native / "model.safetensors.index.json").read_text())["weight_map"].values()})
    for f in files:
        W.update(load_file(str(f)))
    out = {"model.embed_tokens.weight": W.pop("model.embed_tokens.weight"),
           "model.final_norm.weight": W.pop("model.norm.weight")}
    for k in ("hidden_states_scale", "hidden_states_bias"):
        out[f"model.layers.0.res_scale.{k}"] = W.pop(f"model.input_{k}")
    for i in range(L):
        p, a, m = f"model.layers.{i}.", f"model.layers.{2 * i}.", f"model.layers.{2 * i + 1}."
        for nat, leg in ATTN.items():
            out[a + leg] = W.pop(p + nat)
        for nat, leg in MOE.items():
            if p + nat in W:  # layer 0 has no router_states_scale
                out[m + leg] = W.pop(p + nat)
        after = f"model.layers.{2 * i + 2}.res_scale." if i + 1 < L else "model.res_scale."
        for k in ("hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"):
            out[m + "res_scale." + k] = W.pop(p + "post_attention_residual_scale." + k)
            out[after + k] = W.pop(p + "post_mlp_residual_scale." + k)
        gate_up, down = W.pop(p + "mlp.experts.gate_up_proj"), W.pop(p + "mlp.experts.down_proj")
        for e in range(E):
            out[m + f"zaya_block.experts.local_experts.{e}.linear_fc1.weight"] = np.ascontiguousarray(gate_up[e])
            out[m + f"zaya_block.experts.local_experts.{e}.linear_fc2.weight"] = np.ascontiguousarray(down[e])
    W.pop("lm_head.weight", None)
    if W:
        raise SystemExit(f"native tensors not converted: {sorted(W)}")
    legacy.mkdir(parents=True, exist_ok=True)
    (legacy / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(out, str(legacy / "model.safetensors"), metadata={"format": "pt"})
    print(f"{native} -> {legacy}: {len(out)} legacy tensors, {halves} half-layers")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
