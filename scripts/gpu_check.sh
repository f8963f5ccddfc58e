#!/usr/bin/env bash
# One-call GPU check for the device tool: install if needed, then run scripts/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || make install
export HF_HUB_OFFLINE=1
.venv/bin/python scripts/gpu_check.py --arch "${ARCH:-olmo3}" --out "${OUT:-/tmp}/gpu_check.json" "$@"
