#!/usr/bin/env bash
# One-call GPU check for the device tool, on a bare GPU machine: no install step (nothing can be fetched
# there). It runs with the project's .venv when there is one, else with the machine's python3, which must
# already hold torch and transformers; packages it lacks travel as wheels in .whl/ (installed from there, no
# index). A real tokenizer for the prompts travels in .gpu-tokenizer/ (`make gpu-prep` fills both folders'
# tokenizer part from the embedded model); carry .gpu-tokenizer (and .whl if needed) with the call.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/readout-site .whl/*.whl
    export PYTHONPATH="/tmp/readout-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "import torch, transformers" 2> /dev/null; then
    echo "error: $PY cannot import torch and transformers; carry their wheels in .whl/ or run make install first" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
"$PY" scripts/gpu_check.py --arch "${ARCH:-olmo3}" --out "${OUT:-/tmp}/gpu_check.json" "$@"
