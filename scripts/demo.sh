#!/usr/bin/env bash
# The main job: set everything up, then run the demo. Until the trainer lands (issue #5) the
# demo is `zaya sysinfo`.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
"$here/setup.sh"
"$here/zaya" sysinfo
