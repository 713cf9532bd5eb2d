#!/usr/bin/env bash
# The Python environment for reference tests and plots, under .venv/ in the repository.
# Versions are pinned in scripts/requirements.txt (and, for header-only build dependencies such as
# cudnn-frontend, scripts/requirements-headers.txt); a stamp file makes a second run a no-op.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ZAYA_ROOT"
req="$ZAYA_ROOT/scripts/requirements.txt"
req_headers="$ZAYA_ROOT/scripts/requirements-headers.txt"  # C++ headers only: installed --no-deps
stamp="$ZAYA_ROOT/.venv/.zaya-requirements"
if [[ -f "$stamp" ]] && cat "$req" "$req_headers" | cmp -s - "$stamp"; then
  exit 0
fi
echo "setup: creating the Python environment in .venv (torch, transformers, ...; a few minutes once)"
python3 -m venv "$ZAYA_ROOT/.venv"
"$ZAYA_ROOT/.venv/bin/pip" install -q --disable-pip-version-check --upgrade pip
"$ZAYA_ROOT/.venv/bin/pip" install -q --disable-pip-version-check -r "$req"
"$ZAYA_ROOT/.venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req_headers"
cat "$req" "$req_headers" > "$stamp"
