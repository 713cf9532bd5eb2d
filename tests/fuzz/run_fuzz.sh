#!/usr/bin/env bash
# Builds the libFuzzer targets for the checkpoint parsers with clang (-fsanitize=fuzzer,address,
# undefined) straight from the sources they need (CMake never sees tests/fuzz/) and runs each for
# FUZZ_SECONDS (default 60). Crashes land in build/fuzz/artifacts/; turn each into a regression
# test in tests/ckpt/. Usage: tests/fuzz/run_fuzz.sh [target...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${FUZZ_BUILD:-$ROOT/build/fuzz}"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
CXX="${FUZZ_CXX:-clang++}"
mkdir -p "$OUT/artifacts"

FLAGS=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$ROOT/src" -Wall -Wextra -Wno-missing-field-initializers)
# The parsers and what they call; core's tensor/error code comes along for SafetensorsFile.
COMMON=("$ROOT/src/zaya/ckpt/safetensors.cc" "$ROOT/src/zaya/ckpt/json_strict.cc" "$ROOT/src/zaya/ckpt/fs_util.cc"
        "$ROOT/src/zaya/ckpt/checksum.cc" "$ROOT/src/zaya/ckpt/manifest.cc" "$ROOT/src/zaya/core/error.cc"
        "$ROOT/src/zaya/core/tensor.cc" "$ROOT/src/zaya/core/cuda_runtime.cc")

# Seed corpora: a valid file / manifest and a few near misses, so the fuzzer starts inside the format.
seed() {
  local dir="$OUT/corpus_$1"
  mkdir -p "$dir"
  python3 - "$1" "$dir" <<'PY'
import json, struct, sys
kind, d = sys.argv[1], sys.argv[2]
def st(header, data):
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
if kind == "safetensors_header":
    seeds = [
        st({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}, "__metadata__": {"format": "pt"}}, bytes(22)),
        st({"x": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]}}, bytes(8)),
        st({}, b""),
    ]
else:
    chunk = lambda f, o, s, b, e: {"file": f, "offsets": o, "shape": s, "byte_begin": b, "byte_end": e, "checksum": "crc32c:0badcafe"}
    m = {"format_version": 1, "step": 3, "world": {"size": 2},
         "files": [{"name": "rank_00000.safetensors", "rank": 0, "bytes": 300}, {"name": "rank_00001.safetensors", "rank": 1, "bytes": 300}],
         "tensors": {"w": {"dtype": "F32", "shape": [4, 3], "chunks": [chunk("rank_00000.safetensors", [0, 0], [2, 3], 128, 152),
                                                                       chunk("rank_00001.safetensors", [2, 0], [2, 3], 128, 152)]},
                     "s": {"dtype": "I64", "shape": [], "chunks": [chunk("rank_00000.safetensors", [], [], 152, 160)]}},
         "state": {"rng": [1, 2], "loader": {"index": 5}}}
    seeds = [json.dumps(m).encode(), json.dumps(m, indent=1).encode()]
for i, s in enumerate(seeds):
    open(f"{d}/seed{i}", "wb").write(s)
PY
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(safetensors_header manifest)
for t in "${targets[@]}"; do
  echo "== building fuzz_$t"
  "$CXX" "${FLAGS[@]}" "$ROOT/tests/fuzz/fuzz_$t.cc" "${COMMON[@]}" -o "$OUT/fuzz_$t"
  seed "$t"
  echo "== running fuzz_$t for ${SECONDS_PER_TARGET}s"
  # -max_len bounds one input (the quadratic chunk-overlap check stays cheap); -timeout flags any
  # input that takes over 10 s as a hang.
  "$OUT/fuzz_$t" "$OUT/corpus_$t" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix="$OUT/artifacts/${t}-" -print_final_stats=1
done
echo "== fuzzing finished without crashes"
