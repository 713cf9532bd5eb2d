#!/usr/bin/env bash
# The first steps of the demo's training, losses printed with every digit: the check that a
# restructuring changed nothing the program computes. Run it with the binary before and after a
# change, on the same machine and thread count, and compare the two outputs (they must be equal).
#   benchmarks/demo_losses.sh [ZAYA_BINARY] [STEPS] [--set KEY=VALUE ...]   (needs data/pydocs_*: scripts/demo.sh makes it)
# Options after STEPS go to `zaya train`: e.g. `--set train.recompute=true`, which must print the same.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$ZAYA_ROOT"
zaya="${1:-$ZAYA_BUILD/zaya}"
steps="${2:-30}"
extra=("${@:3}")
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$zaya" train --config configs/demo.toml --set train.steps="$steps" --set optim.warmup_steps=10 \
  --set train.out_dir="$out/run" --set train.progress=false "${extra[@]}" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
python3 - "$out/run/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r:
        print(f"step {r['step']:4d} loss {r['loss']!r} grad_norm {r['grad_norm']!r}")
    elif "val_loss" in r:
        print(f"step {r['step']:4d} val_loss {r['val_loss']!r}")
PY
