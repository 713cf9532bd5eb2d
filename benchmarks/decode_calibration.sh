#!/usr/bin/env bash
# Decode roofline calibration (docs/sizing.md, "Calibration"): measured `zaya generate` decode
# tokens/s at several batch sizes against `zaya size`'s prediction on a profile measured on this
# machine (memory bandwidth from `zaya bench membw`, f32 GEMM rates from `zaya bench gemm` at the
# decode's shapes, and the decoder's experts op itself at each batch, `--experts-tokens`: the
# profile's experts_table). Writes OUT/ (default: a new temporary directory, printed): the profile,
# the raw outputs and summary.txt, which docs/results/decode-calibration.md summarizes.
#
#   benchmarks/decode_calibration.sh [OUT] [THREADS] [BATCHES]   e.g. ... "$(mktemp -d)" 2 "1 8 32"
#   PREDICT_ONLY=1 benchmarks/decode_calibration.sh OUT ...   re-predict from OUT's measurements
#
# On a GPU (scripts/gpu_check.sh decode-calibration runs this): DEVICE=cuda times `bench gemm
# --backend cuda` and `generate --device cuda`; `zaya bench membw` measures the host only, so the
# device's bandwidth comes from MEMBW (bytes/s, e.g. the datasheet's 4.8e12 for an H200). CFG picks
# the model (default benchmarks/decode_calibration.toml; on a GPU configs/zaya1-base.toml, whose
# weights are large enough to stream from HBM).
set -euo pipefail
cd "$(dirname "$0")/.."
ZAYA=${ZAYA:-build/cuda/zaya}
OUT=${1:-$(mktemp -d)}
echo "decode_calibration: writing $OUT"
THREADS=${2:-$(nproc)}
BATCHES=${3:-1 8 32}
CFG=${CFG:-benchmarks/decode_calibration.toml}
DEVICE=${DEVICE:-cpu}
PROMPT=16 NEW=33 REPEATS=${REPEATS:-3}
case "$DEVICE" in
cpu) gemm_shapes=--gemm-shapes ;;  # the decode's GEMM time per shape: the CPU's GEMM timer only
cuda) gemm_shapes=""; [ -n "${MEMBW:-}" ] || { echo "decode_calibration: DEVICE=cuda needs MEMBW=bytes/s (the device's bandwidth)" >&2; exit 2; } ;;
*) echo "decode_calibration: DEVICE must be cpu or cuda, found $DEVICE" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE
if [ -z "${PREDICT_ONLY:-}" ]; then

"$ZAYA" sysinfo > "$OUT/sysinfo.txt"
if [ "$DEVICE" = cpu ]; then
  # Bandwidth: STREAM triad on 256 MiB arrays (far past the caches) at the thread count generate uses.
  "$ZAYA" --threads "$THREADS" bench membw --min-bytes 256M --max-bytes 256M --threads "$THREADS" \
    --json "$OUT/membw.json" > "$OUT/membw.txt"
  membw_flag=(--membw "$OUT/membw.json")
else
  membw_flag=()
fi
# GEMM rates at the decode's shapes: one training step's GEMMs of the model at B tokens (forward
# shapes are the decode's, at M = B rows and B/E per expert), f32 as the CPU decoder runs them; and
# the experts op (ops::experts_forward) at B tokens, each call on weights not in cache, which is
# what prices decode's experts (docs/sizing.md, "Serving"). `bench gemm --out` writes one run's
# tables; the runs' tables are merged into profile.json.
for B in $BATCHES; do
  "$ZAYA" --threads "$THREADS" bench gemm --backend "$DEVICE" --shapes "model:$CFG" --tokens "$B" --dtype f32 \
    --ref-dim 1024 --experts-tokens "$B" "${membw_flag[@]}" --name "$DEVICE-f32-decode" \
    --out "$OUT/profile-tokens$B.json" > "$OUT/gemm-tokens$B.txt"
done
python3 - "$OUT" "${MEMBW:-}" $BATCHES <<'PY'
import json, sys
out, membw, batches = sys.argv[1], sys.argv[2], sys.argv[3:]
merged = None
for b in batches:
    p = json.load(open(f"{out}/profile-tokens{b}.json"))
    if merged is None:
        merged = p
    else:
        merged["gemm_table"] += p["gemm_table"]
        merged["experts_table"] = merged.get("experts_table", []) + p.get("experts_table", [])
        merged["achievable_flops"] = max(merged["achievable_flops"], p["achievable_flops"])
merged["source"] = (f"benchmarks/decode_calibration.sh: zaya bench gemm --shapes --experts-tokens at tokens "
                    f"{' '.join(batches)} (f32) + " + (f"memory_bandwidth {membw} (MEMBW)" if membw else "bench membw"))
if membw:
    merged["memory_bandwidth"] = float(membw)
json.dump(merged, open(f"{out}/profile.json", "w"), indent=2)
PY

# Measured: B prompts of PROMPT random ids (fixed seed), NEW new tokens each, greedy, best of REPEATS.
: > "$OUT/measured.txt"
for B in $BATCHES; do
  ids=$(python3 -c "import random; random.seed($B); print(';'.join(','.join(str(random.randrange(3, 32768)) for _ in range($PROMPT)) for _ in range($B)))")
  for r in $(seq "$REPEATS"); do
    "$ZAYA" --threads "$THREADS" generate --device "$DEVICE" --init-config "$CFG" --prompt-ids "$ids" --max-new "$NEW" \
      --ignore-eos --greedy --timing $gemm_shapes 2>> "$OUT/measured.txt" > /dev/null
  done
done
fi

# Predicted: f32 weights and caches as zaya's decoder holds them (CPU and GPU), at the mean context
# of the decode steps (PROMPT + NEW/2 positions).
CTX=$((PROMPT + NEW / 2))
"$ZAYA" size --model "$CFG" --hw "$OUT/profile.json" --prompt "$PROMPT" --context "$CTX" \
  --decode-batches "$(echo $BATCHES | tr ' ' ',')" --weight-bytes 4 --cache-bytes 4 > "$OUT/predicted.txt"

python3 - "$OUT" <<'PY'
import re, sys
out = sys.argv[1]
# Per run: its mean step, and (CPU, --gemm-shapes) its GEMM time per step and the experts' share of
# it (the grouped or fused expert GEMM rows). Per batch the fastest run is kept.
runs = []
for line in open(f"{out}/measured.txt"):
    m = re.search(r"batch (\d+), prompt \d+: .*?\(([0-9.]+) ms per step, ([0-9.]+) tokens/s\)", line)
    if m:
        runs.append({"b": int(m.group(1)), "ms": float(m.group(2)), "gemm": None, "experts": None})
        continue
    m = re.search(r"decode GEMMs ([0-9.]+) ms per step", line)
    if m and runs:
        runs[-1]["gemm"], runs[-1]["experts"] = float(m.group(1)), 0.0
        continue
    m = re.search(r"timing:\s+(.*?)\s+[0-9.]+ calls\s+([0-9.]+) ms per step", line)
    if m and runs and runs[-1]["experts"] is not None and ("grouped" in m.group(1) or "experts" in m.group(1)):
        runs[-1]["experts"] += float(m.group(2))
best = {}
for r in runs:
    if r["ms"] < best.get(r["b"], {"ms": 1e30})["ms"]:
        best[r["b"]] = r
# Predicted rows: batch, experts, weights GiB, kv+state GiB, GFLOP, mem, comp, [experts (ms) when the
# profile's experts_table priced them], step, tokens/s, bound.
pred, pricing = {}, "?"
for line in open(f"{out}/predicted.txt"):
    f = line.split()
    if line.strip().startswith("experts:"):
        pricing = line.strip()
    if len(f) >= 12 and f[0].isdigit() and f[-1] in ("memory", "compute", "experts"):
        experts = f[-4] if len(f) == 13 else "roofline"
        pred[int(f[0])] = (float(f[7]), float(f[8]), experts, float(f[-3]), f[-1], float(f[1]))
fmt = lambda v: "-" if v is None else f"{v:.2f}"
with open(f"{out}/summary.txt", "w") as s:
    s.write(pricing + "\n")
    s.write("batch  distinct  predicted mem / comp / experts / step (ms)  bound    measured step (ms)  GEMMs (ms)  "
            "expert GEMMs (ms)  measured/predicted  tokens/s measured\n")
    for b in sorted(best):
        mem, comp, experts, step, bound, dist = pred[b]
        r = best[b]
        s.write(f"{b:5d}  {dist:8.2f}  {mem:8.2f} {comp:8.2f} {experts:>8s} {step:8.2f}          {bound:8s} {r['ms']:18.2f}  "
                f"{fmt(r['gemm']):>10s}  {fmt(r['experts']):>17s}  {r['ms'] / step:18.2f}  {1e3 * b / r['ms']:17.1f}\n")
print(open(f"{out}/summary.txt").read(), end="")
PY
