#!/usr/bin/env bash
# Decode roofline calibration (docs/sizing.md, "Calibration"): measured `zaya generate` decode
# tokens/s at several batch sizes against `zaya size`'s prediction on a profile measured on this
# machine (memory bandwidth from `zaya bench membw`, f32 GEMM rates from `zaya bench gemm` at the
# decode's shapes). Writes OUT/ (default: a new temporary directory, printed): the profile, the raw
# outputs and summary.txt, which docs/results/decode-calibration.md summarizes.
#
#   benchmarks/decode_calibration.sh [OUT] [THREADS] [BATCHES]   e.g. ... "$(mktemp -d)" 2 "1 8 32"
#   PREDICT_ONLY=1 benchmarks/decode_calibration.sh OUT ...   re-predict from OUT's measurements
set -euo pipefail
cd "$(dirname "$0")/.."
ZAYA=${ZAYA:-build/cuda/zaya}
OUT=${1:-$(mktemp -d)}
echo "decode_calibration: writing $OUT"
THREADS=${2:-$(nproc)}
BATCHES=${3:-1 8 32}
CFG=benchmarks/decode_calibration.toml
PROMPT=16 NEW=33 REPEATS=${REPEATS:-3}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE
if [ -z "${PREDICT_ONLY:-}" ]; then

"$ZAYA" sysinfo > "$OUT/sysinfo.txt"
# Bandwidth: STREAM triad on 256 MiB arrays (far past the caches) at the thread count generate uses.
"$ZAYA" --threads "$THREADS" bench membw --min-bytes 256M --max-bytes 256M --threads "$THREADS" \
  --json "$OUT/membw.json" > "$OUT/membw.txt"
# GEMM rates at the decode's shapes: one training step's GEMMs of the model at B tokens (forward
# shapes are the decode's, at M = B rows and B/E per expert), f32 as the CPU decoder runs them.
# `bench gemm --out` writes one run's table; the runs' tables are merged into profile.json.
for B in $BATCHES; do
  "$ZAYA" --threads "$THREADS" bench gemm --shapes "model:$CFG" --tokens "$B" --dtype f32 --ref-dim 1024 \
    --membw "$OUT/membw.json" --name "cpu-f32-decode" --out "$OUT/profile-tokens$B.json" > "$OUT/gemm-tokens$B.txt"
done
python3 - "$OUT" $BATCHES <<'PY'
import json, sys
out, batches = sys.argv[1], sys.argv[2:]
merged = None
for b in batches:
    p = json.load(open(f"{out}/profile-tokens{b}.json"))
    if merged is None:
        merged = p
    else:
        merged["gemm_table"] += p["gemm_table"]
        merged["achievable_flops"] = max(merged["achievable_flops"], p["achievable_flops"])
merged["source"] = f"benchmarks/decode_calibration.sh: zaya bench gemm --shapes at tokens {' '.join(batches)} (f32) + bench membw"
json.dump(merged, open(f"{out}/profile.json", "w"), indent=2)
PY

# Measured: B prompts of PROMPT random ids (fixed seed), NEW new tokens each, greedy, best of REPEATS.
: > "$OUT/measured.txt"
for B in $BATCHES; do
  ids=$(python3 -c "import random; random.seed($B); print(';'.join(','.join(str(random.randrange(3, 32768)) for _ in range($PROMPT)) for _ in range($B)))")
  for r in $(seq "$REPEATS"); do
    "$ZAYA" --threads "$THREADS" generate --init-config "$CFG" --prompt-ids "$ids" --max-new "$NEW" --ignore-eos \
      --greedy --timing --gemm-shapes 2>> "$OUT/measured.txt" > /dev/null
  done
done
fi

# Predicted: f32 weights and caches as the CPU decoder holds them, at the mean context of the
# decode steps (PROMPT + NEW/2 positions).
CTX=$((PROMPT + NEW / 2))
"$ZAYA" size --model "$CFG" --hw "$OUT/profile.json" --prompt "$PROMPT" --context "$CTX" \
  --decode-batches "$(echo $BATCHES | tr ' ' ',')" --weight-bytes 4 --cache-bytes 4 > "$OUT/predicted.txt"

python3 - "$OUT" <<'PY'
import re, sys
out = sys.argv[1]
best, gemm = {}, {}  # per batch: the fastest run's step and that run's GEMM time per step
b = ms = None
for line in open(f"{out}/measured.txt"):
    m = re.search(r"batch (\d+), prompt \d+: .*?\(([0-9.]+) ms per step, ([0-9.]+) tokens/s\)", line)
    if m:
        b, ms = int(m.group(1)), float(m.group(2))
    m = re.search(r"decode GEMMs ([0-9.]+) ms per step", line)
    if m and b is not None and ms < best.get(b, 1e30):
        best[b], gemm[b] = ms, float(m.group(1))
pred = {}
for line in open(f"{out}/predicted.txt"):
    f = line.split()
    if len(f) >= 12 and f[0].isdigit() and f[-1] in ("memory", "compute"):
        pred[int(f[0])] = (float(f[-5]), float(f[-4]), float(f[-3]), f[-1], float(f[1]))
with open(f"{out}/summary.txt", "w") as s:
    s.write("batch  distinct experts  predicted mem/comp/step (ms)  bound    measured step (ms)  of it GEMMs (ms)  measured/predicted  tokens/s measured\n")
    for b in sorted(best):
        mem, comp, step, bound, dist = pred[b]
        s.write(f"{b:5d}  {dist:16.2f}  {mem:8.2f} {comp:8.2f} {step:8.2f}  {bound:8s} {best[b]:18.2f}  {gemm[b]:16.2f}  {best[b] / step:18.2f}  {1e3 * b / best[b]:17.1f}\n")
print(open(f"{out}/summary.txt").read(), end="")
PY
