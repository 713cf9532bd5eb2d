"""`zaya ckpt export-hf` writes a folder transformers uses whole: the tokenizer (AutoTokenizer
gives SentencePiece's own ids, decode gives the text back, the special ids are config.json's),
generation_config.json, the weights sharded with model.safetensors.index.json above --shard-size,
and pipeline("text-generation") runs on it. The checkpoint comes from a real (tiny) `zaya train`
run whose config names its tokenizer relatively, and the export runs from another directory, so
the checkpoint's tokenizer is found from its run directory.

Exact comparisons: token ids are integers and decode must give the very text back; the weights'
equality to the checkpoint's is tested by test_hf_export.py (same export_hf path).

Run: ZAYA_BINARY=build/cuda/zaya .venv/bin/python -m pytest tests/python/test_hf_full_export.py
"""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytest.importorskip("google.protobuf")  # transformers converts tokenizer.model through protobuf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hf_parity import zaya_binary  # noqa: E402

WORDS = ("the Python interpreter reads source code and runs it line by line while the compiler turns "
         "functions into bytecode objects with names values lists dicts strings").split()
TEXTS = ["The Python interpreter", "  the  compiler\nreads ñ 日本 code\t(x)", "x", "def f():\n    return 1\n"]

RUN_TOML = """
[model]
vocab_size = 320
hidden_size = 32
num_hidden_layers = 2
num_attention_heads = 2
num_key_value_heads = 1
head_dim = 16
num_experts = 2
moe_intermediate_size = 32
router_hidden_size = 8
max_position_embeddings = 128
eos_token_id = 1
bos_token_id = 2
pad_token_id = 0
[data]
train = ["data/tiny_train"]
val = "data/tiny_val"
tokenizer = "data/tiny.model"
[train]
steps = 2
micro_batch = 2
seq_len = 32
eval_every = 2
eval_samples = 2
log_every = 1
out_dir = "runs/tiny"
[optim]
lr = 3e-3
warmup_steps = 1
"""


def zaya(*args, cwd, check=True):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    return subprocess.run([str(Path(zaya_binary()).resolve()), *map(str, args)], cwd=cwd, check=check, capture_output=True, text=True,
                          env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A project directory after `zaya data prepare` and a 2-step `zaya train`, as a user makes one."""
    proj = tmp_path_factory.mktemp("proj")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) for _ in range(400)]
    (proj / "corpus.txt").write_text("\n\n".join(lines) + "\n")
    (proj / "data").mkdir()
    zaya("data", "prepare", "--input", "corpus.txt", "--vocab", 300, "--out", "data/tiny", cwd=proj)
    (proj / "tiny.toml").write_text(RUN_TOML)
    zaya("train", "--config", "tiny.toml", cwd=proj)
    return proj


@pytest.fixture(scope="module")
def export(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    # From another directory: data/tiny.model is only found from the run directory's project.
    res = zaya("ckpt", "export-hf", trained / "runs" / "tiny", "--out", out, "--shard-size", "20KB",
               cwd=out.parent)
    assert "tokenizer.model" in res.stdout, res.stdout
    return out


def test_tokenizer_gives_sentencepiece_ids_and_round_trips(trained, export):
    sp = spm.SentencePieceProcessor(model_file=str(trained / "data" / "tiny.model"))
    tok = AutoTokenizer.from_pretrained(str(export))
    assert len(tok) == sp.get_piece_size()  # no token added that the model has no row for
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == sp.encode(text), text
        assert tok.decode(ids) == text
    cfg = json.loads((export / "config.json").read_text())
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (cfg["bos_token_id"], cfg["eos_token_id"],
                                                                      cfg["pad_token_id"])
    assert (sp.bos_id(), sp.eos_id(), sp.pad_id()) == (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"])
    gen = json.loads((export / "generation_config.json").read_text())
    assert {k: gen[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} == {
        k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def test_weights_are_sharded_with_an_index(export):
    index = json.loads((export / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in export.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and not (export / "model.safetensors").exists()
    assert sorted(set(index["weight_map"].values())) == shards
    assert all((export / s).stat().st_size < 20_000 + 40_000 for s in shards)  # 20KB of tensors + header


def test_text_generation_pipeline_runs(export):
    model = AutoModelForCausalLM.from_pretrained(str(export))
    gen = pipeline("text-generation", model=model, tokenizer=AutoTokenizer.from_pretrained(str(export)))
    out = gen("The Python interpreter", max_new_tokens=4, do_sample=False)
    text = out[0]["generated_text"]
    assert text.startswith("The Python interpreter") and len(text) > len("The Python interpreter")
    assert AutoConfig.from_pretrained(str(export)).model_type == "zaya"


def test_a_tokenizer_that_is_not_found_is_named(trained, tmp_path):
    moved = tmp_path / "elsewhere"
    subprocess.run(["cp", "-r", str(trained / "runs" / "tiny"), str(moved)], check=True)
    # A run directory carries its own copy of the tokenizer, so a copied run exports from anywhere ...
    res = zaya("ckpt", "export-hf", moved, "--out", tmp_path / "carried", cwd=tmp_path)
    assert (tmp_path / "carried" / "tokenizer.model").read_bytes() == (trained / "data" / "tiny.model").read_bytes()
    # ... and without that copy the recorded path is looked for, and named when it is not found.
    (copy,) = list(moved.glob("tokenizer-*.model"))
    copy.unlink()
    res = zaya("ckpt", "export-hf", moved, "--out", tmp_path / "hf", cwd=tmp_path, check=False)
    assert res.returncode == 2
    assert "tokenizer 'data/tiny.model' was not found" in res.stderr and "--tokenizer" in res.stderr
    assert not (tmp_path / "hf").exists()  # nothing half-written
    ok = zaya("ckpt", "export-hf", moved, "--out", tmp_path / "hf", "--tokenizer", trained / "data" / "tiny.model",
              cwd=tmp_path)
    assert (tmp_path / "hf" / "tokenizer.model").exists(), ok.stdout
    again = zaya("ckpt", "export-hf", moved, "--out", tmp_path / "hf", "--no-tokenizer", cwd=tmp_path, check=False)
    assert again.returncode == 2 and "ckpt export-hf --out" in again.stderr  # never mixed with an earlier export


def test_a_llama_style_tokenizer_keeps_its_dummy_prefix(trained, tmp_path):
    # A SentencePiece model that prepends "▁" (as Llama's) exports as LlamaTokenizer, whose
    # conversion prepends it too; GemmaTokenizer would not, and every first word would differ.
    text = (trained / "corpus.txt").read_text()
    prefix = tmp_path / "llama"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_prefix=str(prefix),
                                   vocab_size=300, model_type="bpe", byte_fallback=True, add_dummy_prefix=True,
                                   pad_id=0, eos_id=1, bos_id=2, unk_id=3, minloglevel=2)
    out = tmp_path / "hf"
    zaya("ckpt", "export-hf", trained / "runs" / "tiny", "--out", out, "--tokenizer", f"{prefix}.model", cwd=tmp_path)
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "LlamaTokenizer"
    sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    tok = AutoTokenizer.from_pretrained(str(out))
    for t in ("The Python interpreter", "x", "reads code"):
        assert tok(t)["input_ids"] == sp.encode(t), t


def test_generate_finds_the_tokenizer_from_any_directory(trained, export, tmp_path):
    # A transformers folder: its tokenizer.model. A checkpoint: the tokenizer it records, found
    # from its run directory. Same weights (fp32 export), greedy: the same text from both.
    prompt = "The Python interpreter"
    args = ["--prompt", prompt, "--max-new", 5, "--greedy"]
    from_export = zaya("generate", "--model", export, *args, cwd=tmp_path).stdout
    from_ckpt = zaya("generate", "--model", trained / "runs" / "tiny", *args, cwd=tmp_path).stdout
    assert from_export.startswith(prompt) and len(from_export.rstrip("\n")) > len(prompt)
    assert from_export == from_ckpt
    bare = tmp_path / "bare"
    zaya("ckpt", "export-hf", trained / "runs" / "tiny", "--out", bare, "--no-tokenizer", cwd=tmp_path)
    # Imported back as a zaya checkpoint, the folder's tokenizer comes along (by absolute path).
    zaya("ckpt", "import-hf", export, "--out", tmp_path / "imported", cwd=tmp_path)
    assert zaya("generate", "--model", tmp_path / "imported", *args, cwd=trained).stdout == from_export
    res = zaya("generate", "--model", bare, *args, cwd=tmp_path, check=False)
    assert res.returncode == 2 and "no tokenizer.model" in res.stderr and "--tokenizer" in res.stderr
