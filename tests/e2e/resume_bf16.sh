#!/usr/bin/env bash
# bf16 training on the CPU (the exact emulation of the GPU path) resumes bit for bit: a short
# synthetic run with a checkpoint halfway, then a run resumed from it, must log the same losses for
# the second half; the optimizer checkpoint must hold the f32 master weights.
#   resume_bf16.sh TRAIN_VIT WORKDIR
set -euo pipefail
train_vit=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run=("$train_vit" --precision bf16 --dataset synthetic --synthetic-size 512 --batch-size 32 --eval-batch-size 256
     --steps 8 --warmup-steps 2 --seed 3 --log-every 4 --threads 2)

"${run[@]}" --metrics "$work/a.jsonl" --checkpoint-dir "$work/ckpt" --checkpoint-every 4
"${run[@]}" --metrics "$work/c.jsonl" --resume "$work/ckpt/step-00000004"

losses() { grep '"event":"step"' "$1" | sed -E 's/.*"loss":([^,]+),.*"step":([0-9]+).*/\2 \1/'; }
losses "$work/a.jsonl" > "$work/a.txt"
losses "$work/c.jsonl" > "$work/c.txt"
[[ $(wc -l < "$work/a.txt") -eq 8 ]] || { echo "FAIL: expected 8 step events in a.jsonl"; exit 1; }
[[ $(wc -l < "$work/c.txt") -eq 4 ]] || { echo "FAIL: expected 4 step events after resuming"; exit 1; }
if ! diff <(tail -n 4 "$work/a.txt") "$work/c.txt" > "$work/ac.diff"; then
  echo "FAIL: the resumed bf16 run differs from the uninterrupted one:"; head "$work/ac.diff"; exit 1
fi
# The safetensors header is JSON at the start of the file: the masters are listed there as F32.
header=$(head -c 65536 "$work/ckpt/step-00000004/optimizer.safetensors" | tr -d '\0')
grep -q '"state.0.0.master":{"dtype":"F32"' <<< "$header" ||
  { echo "FAIL: optimizer.safetensors has no f32 master weights (state.0.0.master)"; exit 1; }
grep -q '"dtype":"BF16"' <(head -c 65536 "$work/ckpt/step-00000004/model.safetensors" | tr -d '\0') ||
  { echo "FAIL: model.safetensors holds no bf16 weights"; exit 1; }
echo "OK: a bf16 run resumed from step 4 matches the uninterrupted one bit for bit; masters saved in f32"
