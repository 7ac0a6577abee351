#!/usr/bin/env bash
# Activation recompute changes no bit of training: a short synthetic run with drop-path on, in fp32
# and in bf16, logs the same losses and the same test accuracy with --recompute blocks as without.
#   recompute.sh TRAIN_VIT WORKDIR
set -euo pipefail
source "$(dirname "$0")/resume_lib.sh"
train_vit=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
for precision in fp32 bf16; do
  run=("$train_vit" --precision "$precision" --dataset synthetic --synthetic-size 512 --batch-size 32
       --eval-batch-size 256 --steps 8 --warmup-steps 2 --seed 3 --log-every 1 --threads 2 --drop-path 0.3)
  "${run[@]}" --metrics "$work/$precision-none.jsonl"
  "${run[@]}" --metrics "$work/$precision-blocks.jsonl" --recompute blocks
  losses "$work/$precision-none.jsonl" > "$work/$precision-none.txt"
  losses "$work/$precision-blocks.jsonl" > "$work/$precision-blocks.txt"
  [[ $(wc -l < "$work/$precision-none.txt") -eq 8 ]] || { echo "FAIL: expected 8 logged steps ($precision)"; exit 1; }
  diff "$work/$precision-none.txt" "$work/$precision-blocks.txt" > /dev/null ||
    { echo "FAIL: $precision losses differ with --recompute blocks:"; paste "$work/$precision-none.txt" \
        "$work/$precision-blocks.txt"; exit 1; }
  acc() { grep '"event":"eval"' "$1" | tail -n 1 | sed -E 's/.*"accuracy":([^,}]+).*/\1/'; }
  [[ $(acc "$work/$precision-none.jsonl") == "$(acc "$work/$precision-blocks.jsonl")" ]] ||
    { echo "FAIL: $precision test accuracy differs with --recompute blocks"; exit 1; }
done
"$train_vit" --precision fp8 --recompute blocks --dataset synthetic --steps 1 2> "$work/fp8.err" && {
  echo "FAIL: --recompute blocks with --precision fp8 should be refused for now"; exit 1; }
grep -q "does not support --precision fp8" "$work/fp8.err" || { echo "FAIL: the fp8 refusal does not say why"; exit 1; }
echo "OK: --recompute blocks trains the same bits as without, in fp32 and bf16, with drop-path on"
