#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer, ASan and UBSan (a CPU-only CMake build in
# build/fuzz that compiles only the fuzz targets and the parsers they exercise) and runs each for
# FUZZ_SECONDS (default 60), one after another. The corpus each run grows is kept in
# build/fuzz/corpus/<target> (seeded from tests/fuzz/corpus/<target>, which it never rewrites);
# crashes land in build/fuzz/artifacts/. Turn each crash into a regression test beside the parser's
# tests and, when it is small, a seed in tests/fuzz/corpus/<target>/.
#   tests/fuzz/run_fuzz.sh [target...]   targets: safetensors_header manifest idx hf_config
#                                                 run_config prepare_input (default: all)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/env.sh"
OUT="${FUZZ_BUILD:-$ROOT/build/fuzz}"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
JOBS="${FUZZ_JOBS:-2}"

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(safetensors_header manifest idx hf_config run_config prepare_input)

if [[ ! -f "$OUT/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="${FUZZ_CC:-clang}" -DCMAKE_CXX_COMPILER="${FUZZ_CXX:-clang++}" \
    -DZAYA_CUDA=OFF -DZAYA_FUZZ_ENGINE=libfuzzer -DZAYA_BUILD_BENCHMARKS=OFF -DZAYA_BUILD_TOOLS=OFF >/dev/null
fi
cmake --build "$OUT" -j "$JOBS" --target "${targets[@]/#/fuzz_}"

mkdir -p "$OUT/artifacts"
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$OUT/corpus/$t"
  echo "== fuzz_$t for ${SECONDS_PER_TARGET}s"
  # -max_len bounds one input (the quadratic checks, such as the manifest's chunk overlaps, stay
  # cheap); -timeout flags any input that takes over 10 s as a hang; -rss_limit_mb any that needs
  # over 2 GB (parsers must not allocate by an unchecked count).
  "$OUT/tests/fuzz/fuzz_$t" "$OUT/corpus/$t" "$ROOT/tests/fuzz/corpus/$t" \
      -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$OUT/artifacts/$t-" -print_final_stats=1 || failed+=("$t")
done
if ((${#failed[@]})); then
  echo "== fuzzing found crashes in: ${failed[*]} (inputs in $OUT/artifacts/)" >&2
  exit 1
fi
echo "== fuzzing finished without crashes"
