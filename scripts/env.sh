# Environment every zaya script runs under; sourced, not executed.
# - OpenMPI refuses to run as root unless told; our machines and CI run as root.
# - OpenBLAS must use its AVX-512 (SkylakeX) kernels: some environments force a slower core type
#   (OPENBLAS_CORETYPE=Haswell halves its speed) and 0.3.21 mis-detects newer Xeons as Prescott.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=SkylakeX
else
  unset OPENBLAS_CORETYPE
fi
ZAYA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ZAYA_ROOT
# ccache keys on relative paths under the repository, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR="$ZAYA_ROOT"
# The build preset: cuda whenever nvcc exists (CUDA code must always compile), else cpu.
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  ZAYA_PRESET="${ZAYA_PRESET:-cuda}"
else
  ZAYA_PRESET="${ZAYA_PRESET:-cpu}"
fi
export ZAYA_PRESET
export ZAYA_BUILD="$ZAYA_ROOT/build/$ZAYA_PRESET"
