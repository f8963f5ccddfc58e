#!/usr/bin/env bash
# The merge after a sharded SLURM run (submitted by scripts/slurm_submit.sh with afterany: it runs once every
# task has ended, failed or not). Merges when every chunk is there; otherwise names the shards to resubmit.
#SBATCH --job-name=readout-merge
#SBATCH --cpus-per-task=2
#SBATCH --mem=16G
#SBATCH --time=01:00:00
set -euo pipefail
ROOT=${ROOT:?set by scripts/slurm_submit.sh}
SHARDS=${SHARDS:?set by scripts/slurm_submit.sh}
OUT=${1:?run directory (absolute)}
MODEL=${2:?model} PANEL=${3:?panel} PROFILE=${4:?profile}
cd "$ROOT"
if ! ${READOUT:-"$ROOT/.venv/bin/readout"} merge "$OUT" --shards "$SHARDS"; then
    echo "resubmit each shard named above: STUDY=${STUDY:-run} DEVICE=${DEVICE:-cuda} $ROOT/scripts/slurm_submit.sh $MODEL $PANEL $PROFILE $OUT" \
         "$SHARDS --only <index> (a new merge follows it)" >&2
    exit 1
fi
