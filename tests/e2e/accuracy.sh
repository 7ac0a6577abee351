#!/usr/bin/env bash
# End to end: train_vit learns Fashion-MNIST. Trains a short run and fails unless the final test
# accuracy reaches the bar. The run is bounded by its --steps; CTest's TIMEOUT only ends a hung run.
#   accuracy.sh TRAIN_VIT WORKDIR MIN_ACCURACY [train_vit flags...]
set -euo pipefail
train_vit=$1 work=$2 bar=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
"$train_vit" --metrics "$work/metrics.jsonl" "$@"
accuracy=$(grep '"event":"eval"' "$work/metrics.jsonl" | tail -n 1 | sed -E 's/.*"accuracy":([-0-9.eE+]+).*/\1/')
[[ -n $accuracy ]] || { echo "FAIL: no eval event in $work/metrics.jsonl"; exit 1; }
echo "final test accuracy $accuracy (bar $bar)"
awk -v a="$accuracy" -v b="$bar" 'BEGIN { exit !(a >= b) }' || { echo "FAIL: accuracy $accuracy < $bar"; exit 1; }
