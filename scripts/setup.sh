#!/usr/bin/env bash
# Installs everything zaya needs on a fresh Debian 12 machine (as root) and builds it.
# Idempotent: a second run checks, finds nothing to do, and stays quiet.
#   scripts/setup.sh            install + build
#   scripts/setup.sh --no-venv  skip the Python reference environment
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ZAYA_ROOT"

want_venv=1
[[ "${1:-}" == "--no-venv" ]] && want_venv=0

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libdnnl-dev ocl-icd-opencl-dev libopenblas-dev  # dnnl's CMake config finds OpenCL (only a Recommends)
  libsentencepiece-dev sentencepiece
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  python3-venv python3-dev
  clang libclang-rt-14-dev
  python3-doc
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ((want_venv)); then
  "$ZAYA_ROOT/scripts/venv.sh"
fi

echo "setup: building ($ZAYA_PRESET preset)"
if [[ ! -f "$ZAYA_BUILD/build.ninja" ]]; then
  cmake --preset "$ZAYA_PRESET" >/dev/null
fi
cmake --build "$ZAYA_BUILD" | grep -vE '^\[[0-9]+/[0-9]+\]' || true
test -x "$ZAYA_BUILD/zaya" || { echo "setup: build failed" >&2; exit 1; }
echo "setup: done; binary at ${ZAYA_BUILD#$ZAYA_ROOT/}/zaya"
