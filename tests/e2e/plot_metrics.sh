#!/usr/bin/env bash
# End to end: tools/plot_metrics.py draws real runs. It overlays two train_vit runs' --metrics, fp32
# and fp8 with a logged layer (e2e.fashion_mnist_accuracy's and e2e.fashion_mnist_fp8_accuracy's
# 700-step runs: CTest fixtures, so nothing is trained twice), and the test fails unless it wrote a
# PNG (its signature) of plausible size with every panel it should have drawn.
#   plot_metrics.sh FP32_METRICS FP8_METRICS WORKDIR
set -euo pipefail
fp32=$1 fp8=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
for run in "$fp32" "$fp8"; do
  [[ -s $run ]] || { echo "FAIL: no metrics at $run: run the e2e accuracy tests first (ctest adds them as fixtures)"; exit 1; }
done
grep -q '"fp8":{' "$fp8" || { echo "FAIL: $fp8 logs no FP8 layer (--fp8-log-layer)"; exit 1; }
# As the README writes it: plain python3, whichever comes first on PATH (the script finds a python3
# with matplotlib itself; tests/tools/plot_metrics_python.sh tests that).
out=$(python3 "$here/../../tools/plot_metrics.py" "$fp32" "$fp8" -o "$work/runs.png")
echo "$out"
for panel in loss lr accuracy throughput amax scale fp8_error; do
  [[ $out == *"$panel"* ]] || { echo "FAIL: no $panel panel"; exit 1; }
done
[[ $(head -c 8 "$work/runs.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  { echo "FAIL: $work/runs.png is not a PNG"; exit 1; }
size=$(stat -c %s "$work/runs.png")
echo "runs.png: $size bytes"
((size > 50000 && size < 5000000)) || { echo "FAIL: $size bytes is not a plausible size for seven panels"; exit 1; }
