#!/usr/bin/env bash
# Activation recompute under DDP and FSDP changes no bit of training: 2 ranks, drop-path on, the same
# losses with --recompute blocks as without: DDP in fp32 with 2 micro-batches a step (the first
# backward skips the all-reduce), FSDP (full shard) in bf16 and in fp8. (The
# rerun's backward joins the step's backward pass, so DDP's end-of-backward wait runs once, after every
# bucket; under FSDP the rerun runs on the unit that backward gathers anyway.)
#   recompute_parallel.sh TRAIN_VIT MPIRUN WORKDIR
set -euo pipefail
source "$(dirname "$0")/resume_lib.sh"
train_vit=$1 mpirun=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
for setting in "ddp fp32 2" "fsdp bf16 1" "fsdp fp8 1"; do
  read -r parallel precision accum <<< "$setting"
  for recompute in none blocks; do
    name="$parallel-$precision-$recompute"
    "$mpirun" --oversubscribe --mca btl self,vader -np 2 "$train_vit" --parallel "$parallel" --precision "$precision" \
      --batch-size 32 --steps 6 --seed 1 --threads 1 --log-every 1 --drop-path 0.2 --dataset synthetic \
      --synthetic-size 512 --grad-accum "$accum" --recompute "$recompute" --metrics "$work/$name.jsonl" > "$work/$name.log" 2>&1 ||
      { cat "$work/$name.log"; exit 1; }
    losses "$work/$name.jsonl" > "$work/$name.txt"
  done
  [[ $(wc -l < "$work/$parallel-$precision-none.txt") -eq 6 ]] || { echo "FAIL: expected 6 logged steps"; exit 1; }
  diff "$work/$parallel-$precision-none.txt" "$work/$parallel-$precision-blocks.txt" > /dev/null ||
    { echo "FAIL: $parallel $precision losses differ with --recompute blocks:"
      paste "$work/$parallel-$precision-none.txt" "$work/$parallel-$precision-blocks.txt"; exit 1; }
done
echo "OK: DDP (fp32, 2 micro-batches) and FSDP (bf16, fp8) at 2 ranks train the same bits with --recompute blocks as without"
