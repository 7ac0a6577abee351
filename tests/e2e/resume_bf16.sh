#!/usr/bin/env bash
# bf16 training on the CPU (the exact emulation of the GPU path) resumes bit for bit: a short
# synthetic run with a checkpoint halfway, then a run resumed from it, must log the same losses for
# the second half; the optimizer checkpoint must hold the f32 master weights.
#   resume_bf16.sh TRAIN_VIT WORKDIR
set -euo pipefail
source "$(dirname "$0")/resume_lib.sh"
train_vit=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run=("$train_vit" --precision bf16 --dataset synthetic --synthetic-size 512 --batch-size 32 --eval-batch-size 256
     --steps 8 --warmup-steps 2 --seed 3 --log-every 4 --threads 2)

"${run[@]}" --metrics "$work/a.jsonl" --checkpoint-dir "$work/ckpt" --checkpoint-every 4
"${run[@]}" --metrics "$work/c.jsonl" --resume "$work/ckpt/step-00000004"

expect_resumed_matches "$work" bf16
# The safetensors header is JSON at the start of the file: the masters are listed there as F32.
header=$(head -c 65536 "$work/ckpt/step-00000004/optimizer.safetensors" | tr -d '\0')
grep -q '"state.0.0.master":{"dtype":"F32"' <<< "$header" ||
  { echo "FAIL: optimizer.safetensors has no f32 master weights (state.0.0.master)"; exit 1; }
grep -q '"dtype":"BF16"' <(head -c 65536 "$work/ckpt/step-00000004/model.safetensors" | tr -d '\0') ||
  { echo "FAIL: model.safetensors holds no bf16 weights"; exit 1; }
echo "OK: a bf16 run resumed from step 4 matches the uninterrupted one bit for bit; masters saved in f32"
