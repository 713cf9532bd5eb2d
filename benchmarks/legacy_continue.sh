#!/usr/bin/env bash
# Continue pretraining from a legacy-layout ZAYA1 model, at demo size (docs/train.md, "Continue
# pretraining ZAYA1-base"; results in docs/results/legacy-continue.md):
#   A  train a small ZAYA1 model natively (the stand-in for a released base model),
#   -> export it (native transformers layout), rewrite it in ZAYA1-base's legacy layout
#      (benchmarks/native_to_legacy.py),
#   B  continue from the legacy directory with train.init_from (a lower peak lr, a short warm-up),
#   C  the same run as B from random weights (the control).
# B's first losses must sit where A ended, not where C starts.
#   benchmarks/legacy_continue.sh [ZAYA_BINARY] [OUT_DIR]   (needs data/pydocs_*: scripts/demo.sh makes it)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$ZAYA_ROOT"
zaya="${1:-$ZAYA_BUILD/zaya}"
out="${2:-runs/legacy-continue}"
rm -rf "$out"
mkdir -p "$out"
py="${ZAYA_PYTHON:-.venv/bin/python}"

# A demo-size model: the demo's shapes at half the width and depth, shorter sequences.
model=(--set model.hidden_size=128 --set model.num_hidden_layers=2 --set model.head_dim=32
       --set model.moe_intermediate_size=256 --set model.router_hidden_size=32)
common=(--config configs/demo.toml "${model[@]}" --set train.seq_len=128 --set train.micro_batch=8
        --set train.eval_every=50 --set train.eval_samples=32 --set train.log_every=10 --set train.progress=false
        --set ckpt.every=1000)
steps_a="${STEPS_A:-300}"
steps_b="${STEPS_B:-150}"

echo "== A: native pretraining, $steps_a steps, peak lr 3e-3"
"$zaya" train "${common[@]}" --set train.steps="$steps_a" --set optim.warmup_steps=30 \
  --set train.out_dir="$out/A" >"$out/A.log" 2>&1
"$zaya" ckpt export-hf "$out/A" --out "$out/A-native" --no-tokenizer
"$py" benchmarks/native_to_legacy.py "$out/A-native" "$out/A-legacy"

# The same validation loss from the native export and from the legacy rewrite: the import is exact.
for m in A-native A-legacy; do
  echo "$m: $("$zaya" eval --model "$out/$m" --data data/pydocs_val --samples 32 --seq 128 2>&1 | tail -1)"
done

# The continued run: init_from the legacy directory itself (import-hf would write the same start
# point as a checkpoint), a lower peak (1e-3 against 3e-3) after a short warm-up, the same data.
# A model read from the legacy layout has the legacy MoE's skip passthrough (docs/model.md), so the
# continued runs' [model] says so too (A's skip bias is -1: the skip class never wins, and the
# passthrough never acts, but init_from needs the configs to match).
cont=(--set optim.lr=1e-3 --set optim.min_lr=1e-4 --set optim.warmup_steps=15 --set train.steps="$steps_b"
      --set model.skip_passthrough=true)
echo "== B: continue from the legacy layout, $steps_b steps, peak lr 1e-3"
"$zaya" train "${common[@]}" "${cont[@]}" --set train.init_from="$out/A-legacy" \
  --set train.out_dir="$out/B" >"$out/B.log" 2>&1
echo "== C: the same run from random weights"
"$zaya" train "${common[@]}" "${cont[@]}" --set train.out_dir="$out/C" >"$out/C.log" 2>&1

"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def rows(run):
    return [json.loads(l) for l in open(out / run / "metrics.jsonl")]
for run in ("A", "B", "C"):
    r = rows(run)
    train = [(x["step"], x["loss"]) for x in r if "loss" in x]
    val = [(x["step"], x["val_loss"]) for x in r if "val_loss" in x]
    print(f"{run}: train loss " + ", ".join(f"{s}:{l:.3f}" for s, l in train[:3]) + " ... "
          + ", ".join(f"{s}:{l:.3f}" for s, l in train[-3:]))
    print(f"{run}: val loss   " + ", ".join(f"{s}:{l:.3f}" for s, l in val))
PY
