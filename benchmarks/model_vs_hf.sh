#!/usr/bin/env bash
# benchmarks/model_vs_hf.py under the repository environment (scripts/env.sh sets OPENBLAS_CORETYPE
# and library paths as for every zaya run). Usage: benchmarks/model_vs_hf.sh [--zaya BIN] [--threads N] ...
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
exec "$root/.venv/bin/python" "$root/benchmarks/model_vs_hf.py" "$@"
