#!/usr/bin/env bash
# Alternates `zaya forward --bench-steps --sections` (the demo step split by part) between several
# zaya binaries, so that builds of two code versions are compared in the same minutes of a machine
# whose speed drifts. For the lent GPU machine's many-core host, where tools/switch_ab.cc's
# in-process pairs are not needed to see a difference of ~10%.
#
#   tools/sections_ab.sh THREADS ROUNDS BIN_A [BIN_B ...]
#
# Prints, per round and binary, the step and the parts, then per binary the median step and the
# median of each part over the rounds. Run from the repository root (configs/demo.toml).
set -euo pipefail
threads="${1:?threads}" rounds="${2:?rounds}"
shift 2
(($# >= 1)) || { echo "usage: $0 THREADS ROUNDS BIN_A [BIN_B ...]" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 0; r < rounds; ++r)); do
  # Alternate the order each round: the first run of a round may catch a slower moment.
  if ((r % 2 == 0)); then order=("$@"); else order=(); for ((i = $#; i >= 1; --i)); do order+=("${!i}"); done; fi
  for bin in "${order[@]}"; do
    id=$(printf '%s' "$bin" | md5sum | cut -c1-8)
    "$bin" --threads "$threads" forward --init-config configs/demo.toml --seed 1 --bench-steps 5 --batch 8 \
      --seq 256 --sections > "$tmp/run" 2>&1
    echo "round $r $bin: $(grep 'bench: forward' "$tmp/run")"
    cat "$tmp/run" >> "$tmp/$id"
  done
done
python3 - "$tmp" "$@" <<'PY'
import hashlib, re, statistics, sys
tmp, bins = sys.argv[1], sys.argv[2:]
for b in bins:
    text = open(f"{tmp}/{hashlib.md5(b.encode()).hexdigest()[:8]}").read()
    steps = [float(x) for x in re.findall(r"bench: forward .* step ([0-9.]+) ms", text)]
    parts = {}
    for name, t in re.findall(r"bench:   ((?:forward|backward): [^\n]*?)\s+([0-9.]+) ms", text):
        parts.setdefault(name.strip(), []).append(float(t))
    print(f"{b}: median step {statistics.median(steps):.1f} ms over {len(steps)} runs ({min(steps):.1f}-{max(steps):.1f})")
    for name, ts in parts.items():
        print(f"  {name:<62} {statistics.median(ts):7.2f} ms")
PY
