#!/usr/bin/env bash
# Activation recompute changes no bit of training: a short synthetic run with drop-path on, in fp32,
# bf16 and fp8, logs the same losses and the same test accuracy with --recompute blocks as without,
# while the activations the forward saves for backward (the metrics' memory_ledger) fall to about one
# block input per block.
#   recompute.sh TRAIN_VIT WORKDIR
set -euo pipefail
source "$(dirname "$0")/resume_lib.sh"
train_vit=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
for precision in fp32 bf16 fp8; do
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
  saved() { python3 -c "import json,sys
print(next(e['memory_ledger']['saved_activations_bytes'] for e in map(json.loads, open(sys.argv[1]))
           if e.get('event') == 'step' and 'memory_ledger' in e))" "$1"; }
  none=$(saved "$work/$precision-none.jsonl") blocks=$(saved "$work/$precision-blocks.jsonl")
  echo "$precision: activations saved for backward $none bytes, $blocks with --recompute blocks"
  (( blocks > 0 && 4 * blocks < none )) || { echo "FAIL: $precision saved activations did not fall"; exit 1; }
done
echo "OK: --recompute blocks trains the same bits as without, in fp32, bf16 and fp8, with drop-path on"
