#!/usr/bin/env bash
# Submit a sharded readout run to SLURM: an array of SHARDS tasks (scripts/slurm_readout.sh), each one shard
# into a shared run directory, and a merge job (scripts/slurm_merge.sh) that runs after all of them have
# ended (afterany: a failed task does not leave the merge waiting forever; the merge names what is missing).
#
#   scripts/slurm_submit.sh olmo-3-7b gap-v2 paper runs/olmo/paper 16
#   STUDY=nsi scripts/slurm_submit.sh olmo-3-7b nsi-14 paper runs/olmo/nsi-paper 7
#   scripts/slurm_submit.sh olmo-3-7b gap-v2 paper runs/olmo/paper 16 --only 5     # resubmit shard 5 of 16
#
# Logs go to LOGS (default <repo>/logs; created here). Extra sbatch options: SBATCH_ARGS="--partition=gpu --account=x".
# The tasks run on DEVICE (default cuda; a task on a node whose GPU cannot be used fails at once). On CPU nodes:
#   DEVICE=cpu SBATCH_ARGS=--gres=none scripts/slurm_submit.sh ...
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL=${1:?model alias, folder or HF id}
PANEL=${2:?panel (gap-v2, nsi-14, ...)}
PROFILE=${3:?profile (quick, paper)}
OUT=${4:?run directory}
SHARDS=${5:?number of shards}
ONLY=""
if [ "${6:-}" = "--only" ]; then ONLY=${7:?--only needs a shard index}; fi
case "$SHARDS" in ''|*[!0-9]*) echo "error: shards: '$SHARDS' is not a positive integer" >&2; exit 2 ;; esac
[ "$SHARDS" -ge 1 ] || { echo "error: shards: must be >= 1" >&2; exit 2; }
case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac
SBATCH=${SBATCH:-sbatch}
LOGS=${LOGS:-$ROOT/logs}
mkdir -p "$LOGS"
ARRAY="0-$((SHARDS - 1))"
if [ -n "$ONLY" ]; then
    case "$ONLY" in *[!0-9]*) echo "error: --only: '$ONLY' is not a shard index" >&2; exit 2 ;; esac
    [ "$ONLY" -lt "$SHARDS" ] || { echo "error: --only: $ONLY is not a shard index of $SHARDS shards" >&2; exit 2; }
    ARRAY="$ONLY"
fi
EXPORT="ALL,ROOT=$ROOT,SHARDS=$SHARDS,STUDY=${STUDY:-run},DEVICE=${DEVICE:-cuda}"

# sbatch ARGS...: prints the job id; a refusal (a GPU asked for on a cluster without one, an unknown partition ...)
# ends the script with one line.
submit() {
    local err out why
    err=$(mktemp)
    # shellcheck disable=SC2086
    if ! out=$($SBATCH --parsable ${SBATCH_ARGS:-} "$@" 2>"$err"); then
        why=$(tr '\n' ' ' < "$err" | sed 's/  */ /g; s/ $//')
        rm -f "$err"
        case "$why" in
            *gres*|*GRES*) why="$why (slurm_readout.sh asks for one GPU, #SBATCH --gres=gpu:1; where no node has one, add SBATCH_ARGS=--gres=none DEVICE=cpu)" ;;
        esac
        echo "error: sbatch refused the job: ${why:-no reason given}" >&2
        exit 1
    fi
    cat "$err" >&2
    rm -f "$err"
    echo "${out%%;*}"
}

JOB=$(submit --array="$ARRAY" --chdir="$ROOT" --output="$LOGS/readout-%A_%a.out" --export="$EXPORT" \
      "$ROOT/scripts/slurm_readout.sh" "$MODEL" "$PANEL" "$PROFILE" "$OUT")
echo "submitted array job $JOB: shards $ARRAY of $SHARDS into $OUT"
MERGE=$(submit --dependency="afterany:$JOB" --chdir="$ROOT" --output="$LOGS/readout-merge-%j.out" --export="$EXPORT" \
        "$ROOT/scripts/slurm_merge.sh" "$OUT" "$MODEL" "$PANEL" "$PROFILE")
echo "submitted merge job $MERGE (after every task of $JOB has ended)"
