#!/usr/bin/env bash
# Bitwise reproducibility and exact resume, with the issue's own commands:
#   1. `train_vit --steps 200 --seed 1` twice gives identical step losses;
#   2. resuming from the step-100 checkpoint gives, for steps 101-200, the losses of the
#      uninterrupted run.
#   resume.sh TRAIN_VIT WORKDIR [extra train_vit flags...]
set -euo pipefail
train_vit=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work"
run=("$train_vit" --steps 200 --seed 1 --log-every 100 "$@")

"${run[@]}" --metrics "$work/a.jsonl" --checkpoint-dir "$work/ckpt" --checkpoint-every 100
"${run[@]}" --metrics "$work/b.jsonl"
"${run[@]}" --metrics "$work/c.jsonl" --resume "$work/ckpt/step-00000100"

# "step loss" per line, losses printed by nlohmann::json with round-trip precision.
losses() { grep '"event":"step"' "$1" | sed -E 's/.*"loss":([^,]+),.*"step":([0-9]+).*/\2 \1/'; }
losses "$work/a.jsonl" > "$work/a.txt"
losses "$work/b.jsonl" > "$work/b.txt"
losses "$work/c.jsonl" > "$work/c.txt"
[[ $(wc -l < "$work/a.txt") -eq 200 ]] || { echo "FAIL: expected 200 step events in a.jsonl"; exit 1; }
[[ $(wc -l < "$work/c.txt") -eq 100 ]] || { echo "FAIL: expected 100 step events after resuming"; exit 1; }
[[ $(head -n 1 "$work/c.txt" | cut -d' ' -f1) -eq 101 ]] || { echo "FAIL: the resumed run does not start at step 101"; exit 1; }
if ! diff "$work/a.txt" "$work/b.txt" > "$work/ab.diff"; then
  echo "FAIL: two runs with the same seed differ:"; head "$work/ab.diff"; exit 1
fi
if ! diff <(tail -n 100 "$work/a.txt") "$work/c.txt" > "$work/ac.diff"; then
  echo "FAIL: the resumed run differs from the uninterrupted one:"; head "$work/ac.diff"; exit 1
fi
echo "OK: 200 identical losses twice; steps 101-200 after resuming match bit for bit"
