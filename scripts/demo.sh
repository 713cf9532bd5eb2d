#!/usr/bin/env bash
# The main job: set everything up, prepare the demo corpus, train the demo ZAYA1 model, evaluate it,
# sample from it and plot its metrics. About 10 minutes on 2 CPU cores after the one-time set-up.
#   scripts/demo.sh                 # everything
#   scripts/demo.sh --set train.steps=100 ...   # extra `zaya train` overrides
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/setup.sh"
source "$here/env.sh"
cd "$ZAYA_ROOT"
zaya="$here/zaya"

# The corpus: the Python documentation sources from Debian's python3-doc (11 MB of English).
corpus=/usr/share/doc/python3.11/html/_sources
if [[ ! -f data/pydocs_train.idx ]]; then
  echo "demo: preparing the corpus ($corpus)"
  mkdir -p data  # ignored by git: a fresh clone has none
  "$zaya" data prepare --input "$corpus" --vocab 8192 --out data/pydocs
fi

if [[ -e runs/demo ]]; then  # keep the previous demo run (one generation back), never overwrite it
  rm -rf runs/demo.prev && mv runs/demo runs/demo.prev
  echo "demo: the previous run is now runs/demo.prev"
fi
echo "demo: training (configs/demo.toml; metrics in runs/demo/metrics.jsonl)"
"$zaya" train --config configs/demo.toml "$@"

echo "demo: evaluating runs/demo"
"$zaya" eval --model runs/demo --data data/pydocs_val --samples 256

echo "demo: sampling"
"$zaya" generate --model runs/demo --prompt "The Python interpreter" --max-new 60 --temperature 0.7 --top-p 0.9 --seed 1

baseline=$(python3 -c "import json; print(json.load(open('data/pydocs.json'))['unigram_baseline_nats_per_token'])" 2>/dev/null || true)
"$ZAYA_ROOT/.venv/bin/python" tools/plot_metrics.py runs/demo ${baseline:+--baseline "$baseline"}
"$ZAYA_ROOT/.venv/bin/python" tools/metrics_to_tensorboard.py runs/demo  # view: .venv/bin/tensorboard --logdir runs/demo/tensorboard
