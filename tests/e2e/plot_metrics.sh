#!/usr/bin/env bash
# End to end: tools/plot_metrics.py draws real runs. Two short train_vit runs, fp32 and fp8 with a
# logged layer, write their --metrics; the script overlays them, and the test fails unless it wrote
# a PNG (its signature) of plausible size with every panel it should have drawn.
#   plot_metrics.sh TRAIN_VIT WORKDIR
set -euo pipefail
train_vit=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$train_vit" --steps 12 --eval-every 6 --log-every 3 --metrics "$work/fp32.jsonl" > "$work/fp32.log" 2>&1
"$train_vit" --steps 12 --eval-every 6 --log-every 3 --precision fp8 --fp8-log-layer blocks.0.mlp.fc1 \
  --metrics "$work/fp8.jsonl" > "$work/fp8.log" 2>&1
# As the README writes it: plain python3, whichever comes first on PATH (the script finds a python3
# with matplotlib itself; tests/tools/plot_metrics_python.sh tests that).
out=$(python3 "$here/../../tools/plot_metrics.py" "$work/fp32.jsonl" "$work/fp8.jsonl" -o "$work/runs.png")
echo "$out"
for panel in loss lr accuracy throughput amax scale fp8_error; do
  [[ $out == *"$panel"* ]] || { echo "FAIL: no $panel panel"; exit 1; }
done
[[ $(head -c 8 "$work/runs.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  { echo "FAIL: $work/runs.png is not a PNG"; exit 1; }
size=$(stat -c %s "$work/runs.png")
echo "runs.png: $size bytes"
((size > 50000 && size < 5000000)) || { echo "FAIL: $size bytes is not a plausible size for seven panels"; exit 1; }
