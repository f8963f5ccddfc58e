#!/usr/bin/env bash
# SLURM array job: each task runs one shard of `readout run`; a dependent job merges the chunks.
#
#   sbatch --array=0-7 scripts/slurm_readout.sh olmo-3-7b gap-v2 paper runs/olmo-3-7b/gap-v2/paper-seed0
#   sbatch --dependency=afterok:<array job id> --wrap "make -C $PWD merge RUN=runs/olmo-3-7b/gap-v2/paper-seed0"
#   STUDY=nsi sbatch --array=0-6 scripts/slurm_readout.sh olmo-3-7b nsi-14 paper runs/olmo-3-7b/nsi-14/nsi-paper-seed42
#
# STUDY is the `readout` command of the study: run (the judgment-action study, default) or nsi.
#
# Every task writes its own chunk files into the shared run directory (atomic renames, no locking needed).
# A task that dies can simply be resubmitted: finished chunks are skipped.
#SBATCH --job-name=readout
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=04:00:00
#SBATCH --output=logs/readout-%A_%a.out
set -euo pipefail
MODEL=${1:?model alias, folder or HF id}
STUDY=${STUDY:-run}
PANEL=${2:-gap-v2}
PROFILE=${3:-paper}
OUT=${4:-runs/${MODEL//\//__}/${PANEL}/${PROFILE}-seed0}
TASK=${SLURM_ARRAY_TASK_ID:?submit with --array}
COUNT=${SLURM_ARRAY_TASK_COUNT:?submit with --array}
cd "${SLURM_SUBMIT_DIR:-.}"
export HF_HUB_OFFLINE=1
.venv/bin/readout "$STUDY" --model "$MODEL" --panel "$PANEL" --profile "$PROFILE" --out "$OUT" \
    --shard "$TASK/$COUNT" --no-progress
