#!/usr/bin/env bash
# End to end: FP8 training (CPU emulation) learns as well as fp32. Trains the same run twice, same
# seed and steps, first --precision fp32 then --precision fp8, and fails unless the fp8 final test
# accuracy is within MAX_GAP (absolute, 0.01 = one point) of the fp32 one. Prints both accuracies and
# both run times. CTest's TIMEOUT bounds the time.
#   fp8_accuracy.sh TRAIN_VIT WORKDIR MAX_GAP [train_vit flags...]
set -euo pipefail
train_vit=$1 work=$2 max_gap=$3
shift 3
rm -rf "$work" && mkdir -p "$work"

final_accuracy() {
  grep '"event":"eval"' "$1" | tail -n 1 | sed -E 's/.*"accuracy":([-0-9.eE+]+).*/\1/'
}
declare -A accuracy seconds
for precision in fp32 fp8; do
  start=$(date +%s.%N)
  "$train_vit" --precision "$precision" --metrics "$work/$precision.jsonl" "$@" > "$work/$precision.log" 2>&1 ||
    { echo "FAIL: the $precision run failed:"; tail -n 20 "$work/$precision.log"; exit 1; }
  seconds[$precision]=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  accuracy[$precision]=$(final_accuracy "$work/$precision.jsonl")
  [[ -n ${accuracy[$precision]} ]] || { echo "FAIL: no eval event in $work/$precision.jsonl"; exit 1; }
  echo "$precision: final test accuracy ${accuracy[$precision]} in ${seconds[$precision]} s"
done
grep ' fp8 ' "$work/fp8.log" | tail -n 1  # the logged layer's scales, amaxes and error against bf16
awk -v a="${seconds[fp8]}" -v b="${seconds[fp32]}" 'BEGIN {
  printf "fp8 (CPU emulation) took %.2fx the fp32 run'"'"'s time\n", a / b }'
awk -v a="${accuracy[fp8]}" -v b="${accuracy[fp32]}" -v g="$max_gap" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= g) }' ||
  { echo "FAIL: fp8 accuracy ${accuracy[fp8]} is more than $max_gap from fp32's ${accuracy[fp32]}"; exit 1; }
echo "OK: fp8 accuracy ${accuracy[fp8]} is within $max_gap of fp32's ${accuracy[fp32]}"
