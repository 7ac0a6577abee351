#!/usr/bin/env bash
# Activation recompute under DDP changes no bit of training: 2 ranks, drop-path on, the same losses
# with --recompute blocks as without. (The rerun's backward joins the step's backward pass, so DDP's
# end-of-backward wait runs once, after every bucket.)
#   recompute_ddp.sh TRAIN_VIT MPIRUN WORKDIR
set -euo pipefail
source "$(dirname "$0")/resume_lib.sh"
train_vit=$1 mpirun=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
for recompute in none blocks; do
  "$mpirun" --oversubscribe --mca btl self,vader -np 2 "$train_vit" --parallel ddp --batch-size 32 --steps 6 --seed 1 \
    --threads 1 --log-every 1 --drop-path 0.2 --dataset synthetic --synthetic-size 512 --recompute "$recompute" \
    --metrics "$work/$recompute.jsonl" > "$work/$recompute.log" 2>&1 || { cat "$work/$recompute.log"; exit 1; }
  losses "$work/$recompute.jsonl" > "$work/$recompute.txt"
done
[[ $(wc -l < "$work/none.txt") -eq 6 ]] || { echo "FAIL: expected 6 logged steps"; exit 1; }
diff "$work/none.txt" "$work/blocks.txt" > /dev/null ||
  { echo "FAIL: DDP losses differ with --recompute blocks:"; paste "$work/none.txt" "$work/blocks.txt"; exit 1; }
echo "OK: DDP at 2 ranks trains the same bits with --recompute blocks as without"
