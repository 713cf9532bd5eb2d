#!/usr/bin/env python3
"""Writes the committed seed corpora under tests/fuzz/corpus/<target>/: for each format a few valid
inputs and near misses, so both the CI seed run and libFuzzer start inside the format. Re-run it
after a format change (the seed files are committed; CI does not run this). Files named crash_*
are inputs that once crashed a parser, kept as seeds; this script leaves them alone."""
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent / "corpus"


def put(target, seeds):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
        if not old.name.startswith("crash_"):  # inputs that once crashed a parser stay
            old.unlink()
    for name, data in seeds.items():
        (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data):
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


put("safetensors_header", {
    "two_tensors": safetensors({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
                                "__metadata__": {"format": "pt"}}, bytes(22)),
    "scalar": safetensors({"x": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]}}, bytes(8)),
    "empty": safetensors({}, b""),
})

chunk = lambda f, o, s, b, e: {"file": f, "offsets": o, "shape": s, "byte_begin": b, "byte_end": e,
                               "checksum": "crc32c:0badcafe"}
manifest = {"format_version": 1, "step": 3, "world": {"size": 2},
            "files": [{"name": "rank_00000.safetensors", "rank": 0, "bytes": 300},
                      {"name": "rank_00001.safetensors", "rank": 1, "bytes": 300}],
            "tensors": {"w": {"dtype": "F32", "shape": [4, 3],
                              "chunks": [chunk("rank_00000.safetensors", [0, 0], [2, 3], 128, 152),
                                         chunk("rank_00001.safetensors", [2, 0], [2, 3], 128, 152)]},
                        "s": {"dtype": "I64", "shape": [], "chunks": [chunk("rank_00000.safetensors", [], [], 152, 160)]}},
            "state": {"rng": [1, 2], "loader": {"index": 5}}}
put("manifest", {"compact": json.dumps(manifest), "indented": json.dumps(manifest, indent=1)})


def indexed(code, docs, seqs_per_doc=1):
    """fuzz_idx's input: u16 .bin size | .bin | .idx (data/indexed_dataset.h has the layout)."""
    fmt = "<H" if code == 8 else "<i"
    seqs = [s for d in docs for s in ([d] if seqs_per_doc == 1 else [d[:len(d) // 2], d[len(d) // 2:]])]
    binary = b"".join(struct.pack(fmt, t) for s in seqs for t in s)
    size = 2 if code == 8 else 4
    lengths, pointers, p = [], [], 0
    for s in seqs:
        lengths.append(len(s))
        pointers.append(p)
        p += len(s) * size
    doc_index = [i * seqs_per_doc for i in range(len(docs) + 1)]
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, code, len(seqs), len(doc_index))
    idx += struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
    idx += struct.pack(f"<{len(doc_index)}q", *doc_index)
    return struct.pack("<H", len(binary)) + binary + idx


put("idx", {
    "u16_three_docs": indexed(8, [[5, 6, 7, 1], [9, 1], [65535, 0, 1]]),
    "i32_two_docs": indexed(4, [[100000, 2, 1], [3, 1]]),
    "u16_two_seqs_per_doc": indexed(8, [[1, 2, 3, 4], [5, 6]], seqs_per_doc=2),
    "empty_doc": indexed(8, [[], [4, 1]]),
    "no_docs": indexed(8, []),
})

# What ModelConfig::to_hf_json writes for the default model.
rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
hf = {"architectures": ["ZayaForCausalLM"], "model_type": "zaya", "vocab_size": 8192, "hidden_size": 256,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
      "moe_intermediate_size": 512, "num_experts": 8, "num_experts_per_tok": 1, "router_hidden_size": 64,
      "cca_time0": 2, "cca_time1": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
      "initializer_range": 0.02, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": True,
      "layer_types": ["hybrid"] * 4, "rope_parameters": {"hybrid": rope, "hybrid_sliding": dict(rope)},
      "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1, "use_cache": True}
small = dict(hf, num_hidden_layers=1, layer_types=["hybrid"], vocab_size=300, hidden_size=32, head_dim=8,
             num_experts=2, moe_intermediate_size=16, router_hidden_size=8)
# The legacy layout's config.json (Zyphra's transformers fork; model/legacy_config.h), two layers.
legacy = {"architectures": ["ZayaForCausalLM"], "model_type": "zaya", "cca": True, "zaya_layers": ["a", 2, "a", 2],
          "cca_num_q_heads": [4, 0, 4, 0], "num_query_groups_list": [2, 0, 2, 0],
          "ffn_hidden_size_list": [0, 32, 0, 32], "zaya_mlp_expansion": [0, 8, 0, 8], "kv_channels": 8,
          "num_attention_heads": 8, "hidden_size": 32, "vocab_size": 300, "norm_epsilon": 1e-05,
          "rope_theta": 10000, "partial_rotary_factor": 0.5, "rope_scaling": False, "moe_router_topk": 1,
          "zaya_use_mod": True, "zaya_use_eda": True, "scale_residual_merge": True, "sliding_window": None}
put("hf_config", {"default": json.dumps(hf, indent=2), "small_compact": json.dumps(small),
                  "minimal": json.dumps({"model_type": "zaya"}), "wrong_type": json.dumps({"model_type": "llama"}),
                  "legacy_small": json.dumps(legacy)})

# fuzz_run_config's input: the TOML text, then each --set argument after a NUL byte.
configs = pathlib.Path(__file__).resolve().parents[2] / "configs"
put("run_config", {
    "demo": (configs / "demo.toml").read_text(),
    "recipe": (configs / "recipe-example.toml").read_text(),
    "zaya1_base": (configs / "zaya1-base.toml").read_text(),
    "demo_with_overrides": (configs / "demo.toml").read_text()
    + "\0train.steps=300\0model.num_hidden_layers=2\0optim.lr=1e-3",
    "empty_with_overrides": '\0data.train=["data/x"]\0train.seq_len=64',
    "zaya1_base_with_data": (configs / "zaya1-base.toml").read_text() + '\0data.train=["a", "b"]\0data.weights=[0.25, 0.75]',
})

# fuzz_prepare_input's input: a mode byte (bit 0: .jsonl, bit 1: paragraphs), then the file.
text = "The first line of a text.\nA second line.\n\nA new paragraph, after a blank line.\nAnd its end.\n"
put("prepare_input", {
    "text_file": b"\x00" + text.encode(),
    "text_paragraphs": b"\x02" + text.encode(),
    "jsonl": b"\x01" + "\n".join(json.dumps({"text": t, "id": i}) for i, t in
                                  enumerate(["one document\nwith two lines", "another", "caf\u00e9 \u2603"])).encode(),
    "jsonl_blank_lines": b"\x01" + b'{"text": "a"}\n\n   \n{"text": "b\\nc"}\n',
    "utf8_text": b"\x00" + "Gr\u00fc\u00dfe\n\u65e5\u672c\u8a9e\n".encode(),
})
