#!/usr/bin/env bash
# One-call GPU check for the device tool, on a bare GPU machine: no install step (nothing can be fetched
# there). It runs with $PYTHON when set, else the project's .venv when there is one, else the machine's python3,
# which must already hold torch. The packages the node's image lacks, or holds in an untested version, travel as
# wheels in .whl/ ($WHEELS), installed from there with no index into $SITE; `make gpu-prep` fills .whl/ and puts
# the embedded model's real tokenizer in .gpu-tokenizer/: carry both with the call (docs/gpu-and-clusters.md).
# It runs scripts/gpu_equal.py (the graph path against references, on every tiny family in fp32; FAMILIES narrows
# it), bench/draw_bench.py (the draw alone; DRAW_SHAPES), then scripts/gpu_check.py for each architecture in $ARCH (default: llama3 olmo3), each writing JSON to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/readout-site}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "import torch, transformers" 2> /dev/null; then
    echo "error: $PY cannot import torch and transformers; carry their wheels in $WHEELS/ (make gpu-prep) or run make install first" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUTDIR=${OUT:-/tmp}
# Each part in its own process under its own time limit: one that fails or overruns is reported and the rest run.
status=0
FAMILIES=${FAMILIES:-$("$PY" -c "from engine.tiny import FAMILIES; print(','.join(sorted(FAMILIES)))")}
timeout "${EQUAL_SECONDS:-180}" "$PY" scripts/gpu_equal.py --families "$FAMILIES" --out "$OUTDIR/gpu_equal.json" || status=1
# The draw over the whole vocabulary (top-p 1): block by block against one running sum (bench/draw_bench.py).
timeout "${DRAW_SECONDS:-90}" "$PY" bench/draw_bench.py --device auto --model "" \
    --shapes "${DRAW_SHAPES:-1x128256,256x128256,512x128256}" --out "$OUTDIR" || status=1
for arch in ${ARCH:-llama3 olmo3}; do
    timeout "${ARCH_SECONDS:-300}" "$PY" scripts/gpu_check.py --arch "$arch" --shapes bench/gpu_shapes.json \
        --out "$OUTDIR/gpu_check_$arch.json" "$@" || status=1
done
"$PY" bench/gpu_results.py --run "$OUTDIR" || status=1  # the tables last: the device tool returns the output's end
exit $status
