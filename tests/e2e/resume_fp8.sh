#!/usr/bin/env bash
# FP8 training (delayed scaling, CPU emulation) resumes bit for bit: a short synthetic run with a
# checkpoint halfway, then a run resumed from it, must log the same losses for the second half. The
# checkpoint must hold the FP8 state (fp8.safetensors), and that state must matter: resumed without
# it, the scales start afresh and the losses differ (else this test would prove nothing).
#   resume_fp8.sh TRAIN_VIT WORKDIR
set -euo pipefail
source "$(dirname "$0")/resume_lib.sh"
train_vit=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run=("$train_vit" --precision fp8 --fp8-recipe delayed --fp8-amax-history 16 --dataset synthetic
     --synthetic-size 512 --batch-size 32 --eval-batch-size 256 --steps 8 --warmup-steps 2 --seed 3
     --log-every 4 --threads 2)
checkpoint=$work/ckpt/step-00000004

"${run[@]}" --metrics "$work/a.jsonl" --checkpoint-dir "$work/ckpt" --checkpoint-every 4
[[ -f $checkpoint/fp8.safetensors ]] || { echo "FAIL: $checkpoint has no fp8.safetensors"; exit 1; }
# The safetensors header is JSON at the start of the file.
header=$(head -c 65536 "$checkpoint/fp8.safetensors" | tr -d '\0')
grep -q '"blocks.0.mlp.fc1.fp8.forward.amax_history":{"dtype":"F32","shape":\[16,2\]' <<< "$header" ||
  { echo "FAIL: fp8.safetensors has no 16-step amax history for blocks.0.mlp.fc1"; exit 1; }
"${run[@]}" --metrics "$work/c.jsonl" --resume "$checkpoint"

expect_resumed_matches "$work" fp8

mv "$checkpoint/fp8.safetensors" "$work/fp8.safetensors.aside"
"${run[@]}" --metrics "$work/d.jsonl" --resume "$checkpoint"
losses "$work/d.jsonl" > "$work/d.txt"
if diff -q "$work/c.txt" "$work/d.txt" > /dev/null; then
  echo "FAIL: resuming without fp8.safetensors gives the same losses: the FP8 state is not what makes this exact"
  exit 1
fi
echo "OK: an fp8 run resumed from step 4 matches the uninterrupted one bit for bit; without its FP8 state it does not"
