#!/usr/bin/env bash
# One shard of a readout run, as one task of a SLURM array. Submit through scripts/slurm_submit.sh, which
# passes ROOT (the repository, absolute) and SHARDS (the shard count, explicit so that one index can be
# resubmitted alone: `--array=5` then still runs shard 5 of 8), and sends the log to ROOT/logs.
#
# Arguments: MODEL PANEL PROFILE OUT (OUT relative to ROOT unless absolute). STUDY=run (default) or nsi.
# READOUT overrides the readout command (default: ROOT/.venv/bin/readout).
# DEVICE (default cuda) is passed as --device: on a node whose GPU cannot be used (no driver, a broken one, a
# CPU-only torch) the task fails at once with one line naming the cause, instead of running on the CPU until the
# time limit. DEVICE=cpu runs on the CPU by choice (with SBATCH_ARGS=--gres=none on nodes without a GPU).
#SBATCH --job-name=readout
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=04:00:00
set -euo pipefail
ROOT=${ROOT:?set by scripts/slurm_submit.sh: the repository folder, absolute}
SHARDS=${SHARDS:?set by scripts/slurm_submit.sh: the number of shards of the run}
TASK=${SLURM_ARRAY_TASK_ID:?submit as an array job (scripts/slurm_submit.sh)}
MODEL=${1:?model alias, folder or HF id}
PANEL=${2:?panel}
PROFILE=${3:?profile}
OUT=${4:?run directory}
STUDY=${STUDY:-run}
DEVICE=${DEVICE:-cuda}
case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac
if [ "$TASK" -lt 0 ] || [ "$TASK" -ge "$SHARDS" ]; then
    echo "error: SLURM_ARRAY_TASK_ID=$TASK: not a shard index of $SHARDS shards (0..$((SHARDS - 1)))" >&2
    exit 2
fi
cd "$ROOT"
export HF_HUB_OFFLINE=1
exec ${READOUT:-"$ROOT/.venv/bin/readout"} "$STUDY" --model "$MODEL" --panel "$PANEL" --profile "$PROFILE" \
    --out "$OUT" --shard "$TASK/$SHARDS" --device "$DEVICE" --no-progress
