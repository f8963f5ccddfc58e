#!/usr/bin/env bash
# One-call GPU check for the device tool, on a bare GPU machine: no install step (nothing can be fetched
# there). It runs with $PYTHON when set, else the project's .venv when there is one, else the machine's python3,
# which must already hold torch. The packages the node's image lacks, or holds in an untested version, travel as
# wheels in .whl/ ($WHEELS), installed from there with no index into $SITE; `make gpu-prep` fills .whl/ and puts
# the embedded model's real tokenizer in .gpu-tokenizer/: carry both with the call (docs/gpu-and-clusters.md).
# It runs scripts/gpu_equal.py (the graph path against references, on every tiny family in fp32; FAMILIES narrows
# it), bench/draw_bench.py (the draw alone; DRAW_SHAPES), scripts/gpu_check.py for each architecture in $ARCH
# (default: llama3 olmo3; its parts d,gen,decode,grid), then its generators part (the own decoder's graph and dynamic
# paths, and whether vLLM is here, on a J workload) for the first architecture in $ARCH, each writing JSON to $OUT
# as its figures are measured, and everything it prints (every part's stdout and stderr) to $OUT/gpu_check.log.
#
# Each part runs in its own process under its own time limit (below; each may be set in the environment), so one
# that fails or overruns is reported and the rest run. The limits, start-up included, must add up to less than
# TOTAL_SECONDS (9 minutes: a device call stops at 10), or the script refuses to start.
#   bash scripts/gpu_check.sh --limits      # print the limits and their sum, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_SECONDS=${SETUP_SECONDS:-45}      # installing the carried wheels, the import check, listing the families
EQUAL_SECONDS=${EQUAL_SECONDS:-75}      # scripts/gpu_equal.py
DRAW_SECONDS=${DRAW_SECONDS:-35}        # bench/draw_bench.py
ARCH_SECONDS=${ARCH_SECONDS:-135}       # scripts/gpu_check.py, for each architecture in $ARCH
GEN_SECONDS=${GEN_SECONDS:-60}          # scripts/gpu_check.py --parts generators, for the first architecture in $ARCH
RESULTS_SECONDS=${RESULTS_SECONDS:-15}  # bench/gpu_results.py
KILL_SECONDS=5                          # a part still running this long after its limit's TERM is killed
TOTAL_SECONDS=540
ARCHS=${ARCH:-llama3 olmo3}
read -r -a ARCH_LIST <<< "$ARCHS"
budget() {  # the limits' sum: every part at its limit, plus the kill grace of each timed command
    echo $((SETUP_SECONDS + EQUAL_SECONDS + DRAW_SECONDS + ${#ARCH_LIST[@]} * ARCH_SECONDS + GEN_SECONDS + RESULTS_SECONDS
            + (5 + ${#ARCH_LIST[@]}) * KILL_SECONDS))
}
parts() {
    echo "setup $SETUP_SECONDS s, gpu_equal $EQUAL_SECONDS s, draw_bench $DRAW_SECONDS s, gpu_check $ARCH_SECONDS s" \
         "x ${#ARCH_LIST[@]} (${ARCH_LIST[*]}), generators $GEN_SECONDS s, gpu_results $RESULTS_SECONDS s," \
         "kill grace $KILL_SECONDS s x $((5 + ${#ARCH_LIST[@]}))"
}
limits() { echo "time limits: $(budget) s in all, under $TOTAL_SECONDS s ($(parts))"; }
for v in SETUP_SECONDS EQUAL_SECONDS DRAW_SECONDS ARCH_SECONDS GEN_SECONDS RESULTS_SECONDS; do
    case "${!v}" in ''|*[!0-9]*|0) echo "error: $v: '${!v}' is not a positive number of seconds" >&2; exit 2 ;; esac
done
over() {
    echo "error: time limits: $(budget) s in all ($(parts)), not under $TOTAL_SECONDS s: lower SETUP_SECONDS," \
         "EQUAL_SECONDS, DRAW_SECONDS, ARCH_SECONDS, GEN_SECONDS or RESULTS_SECONDS, or name fewer architectures in ARCH" >&2
    exit 2
}
if [ "${1:-}" = "--limits" ]; then
    [ "$(budget)" -lt "$TOTAL_SECONDS" ] || over
    limits
    exit 0
fi

OUTDIR=${OUT:-/tmp}
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
# Everything printed from here on, by the script and by every part, goes to the log as well.
exec > >(tee -a "$LOG"); TEE_OUT=$!
exec 2> >(tee -a "$LOG" >&2); TEE_ERR=$!
finish() {
    local rc=$?
    exec >&- 2>&-
    wait "$TEE_OUT" "$TEE_ERR" 2> /dev/null || true  # the log is whole when the script returns
    exit "$rc"
}
trap finish EXIT
[ "$(budget)" -lt "$TOTAL_SECONDS" ] || over
limits

# Start-up, within SETUP_SECONDS in all.
setup_end=$((SECONDS + SETUP_SECONDS))
setup_left() { local s=$((setup_end - SECONDS)); echo $((s > 1 ? s : 1)); }
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/readout-site}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    timeout -k "$KILL_SECONDS" "$(setup_left)" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$SITE" "$WHEELS"/*.whl \
        || { echo "error: installing $WHEELS/*.whl into $SITE failed or ran past the start-up's $SETUP_SECONDS s" >&2; exit 2; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! timeout -k "$KILL_SECONDS" "$(setup_left)" "$PY" -c "import torch, transformers" 2> /dev/null; then
    echo "error: $PY cannot import torch and transformers; carry their wheels in $WHEELS/ (make gpu-prep) or run make install first" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -z "${FAMILIES:-}" ]; then
    FAMILIES=$(timeout -k "$KILL_SECONDS" "$(setup_left)" "$PY" -c "from engine.tiny import FAMILIES; print(','.join(sorted(FAMILIES)))") \
        || { echo "error: $PY could not list the tiny families (engine.tiny) within the start-up's $SETUP_SECONDS s" >&2; exit 2; }
fi
echo "start-up: $SECONDS s"

# part NAME LIMIT COMMAND...: runs COMMAND under its limit and says how it ended and how long it took.
status=0
part() {
    local name=$1 limit=$2 t0=$SECONDS rc=0
    shift 2
    timeout -k "$KILL_SECONDS" "$limit" "$@" || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "part $name: stopped at its $limit s limit ($((SECONDS - t0)) s); its figures so far are in $OUTDIR"
        status=1
    elif [ "$rc" -ne 0 ]; then
        echo "part $name: failed, exit $rc ($((SECONDS - t0)) s)"
        status=1
    else
        echo "part $name: done in $((SECONDS - t0)) s of its $limit s"
    fi
}
part gpu_equal "$EQUAL_SECONDS" "$PY" scripts/gpu_equal.py --families "$FAMILIES" --out "$OUTDIR/gpu_equal.json"
# The draw over the whole vocabulary (top-p 1): block by block against one running sum (bench/draw_bench.py).
part draw_bench "$DRAW_SECONDS" "$PY" bench/draw_bench.py --device auto --model "" \
    --shapes "${DRAW_SHAPES:-1x128256,256x128256,512x128256}" --out "$OUTDIR"
for arch in "${ARCH_LIST[@]}"; do
    part "gpu_check $arch" "$ARCH_SECONDS" "$PY" scripts/gpu_check.py --arch "$arch" --shapes bench/gpu_shapes.json \
        --parts d,gen,decode,grid --out "$OUTDIR/gpu_check_$arch.json" "$@"
done
# Its own process and limit: a per-architecture part stopped at its limit leaves this one its time. A --parts given
# to the script narrows the parts above, not this one.
part "generators ${ARCH_LIST[0]}" "$GEN_SECONDS" "$PY" scripts/gpu_check.py --arch "${ARCH_LIST[0]}" \
    --shapes bench/gpu_shapes.json --out "$OUTDIR/gpu_generators_${ARCH_LIST[0]}.json" "$@" --parts generators
part gpu_results "$RESULTS_SECONDS" "$PY" bench/gpu_results.py --run "$OUTDIR"  # the tables last: the device tool returns the output's end
echo "gpu_check.sh: $SECONDS s in all; the log is $LOG"
exit $status
