#!/usr/bin/env bash
# End to end: FP8 training (CPU emulation) learns as well as fp32. Trains --precision fp8 with the
# flags of an fp32 run already made, and fails unless the fp8 final test accuracy is within MAX_GAP
# (absolute, 0.01 = one point) of the fp32 one. The fp32 run is e2e.fashion_mnist_accuracy's (a CTest
# fixture): the same 700 steps with the same seed give the same bits, so training it twice would only
# cost time. Its metrics' start event must hold the very flags of this run but the precision, or the
# test fails saying which differ. Prints both accuracies and both run times. CTest's TIMEOUT bounds
# the time.
#   fp8_accuracy.sh TRAIN_VIT WORKDIR MAX_GAP FP32_METRICS [train_vit flags...]
set -euo pipefail
train_vit=$1 work=$2 max_gap=$3 fp32_metrics=$4
shift 4
rm -rf "$work" && mkdir -p "$work"
[[ -s $fp32_metrics ]] ||
  { echo "FAIL: no fp32 run at $fp32_metrics: run e2e.fashion_mnist_accuracy first (ctest adds it as a fixture)"; exit 1; }

final_accuracy() {
  grep '"event":"eval"' "$1" | tail -n 1 | sed -E 's/.*"accuracy":([-0-9.eE+]+).*/\1/'
}
start=$(date +%s.%N)
"$train_vit" --precision fp8 --metrics "$work/fp8.jsonl" "$@" > "$work/fp8.log" 2>&1 ||
  { echo "FAIL: the fp8 run failed:"; tail -n 20 "$work/fp8.log"; exit 1; }
fp8_seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

# The two runs' flags, as train_vit resolved them (defaults included), must differ in the precision
# (and the fp8 run's recipe) only.
python3 - "$fp32_metrics" "$work/fp8.jsonl" <<'PY' || exit 1
import json, sys
def flags(path):
    for line in open(path):
        event = json.loads(line)
        if event.get("event") == "start":
            return event["flags"]
    sys.exit(f"FAIL: no start event in {path}")
a, b = flags(sys.argv[1]), flags(sys.argv[2])
if a.get("precision") != "fp32":
    sys.exit(f"FAIL: {sys.argv[1]} is a {a.get('precision')} run, not fp32")
# The fp8 run also records its recipe (the fp8_* flags), which an fp32 run has none of.
differ = sorted(k for k in set(a) | set(b)
                if k != "precision" and not (k.startswith("fp8_") and k not in a) and a.get(k) != b.get(k))
if differ:
    sys.exit("FAIL: the fp32 run's flags differ from the fp8 run's in " +
             ", ".join(f"{k} ({a.get(k)} vs {b.get(k)})" for k in differ))
PY

fp32=$(final_accuracy "$fp32_metrics") fp8=$(final_accuracy "$work/fp8.jsonl")
[[ -n $fp32 ]] || { echo "FAIL: no eval event in $fp32_metrics"; exit 1; }
[[ -n $fp8 ]] || { echo "FAIL: no eval event in $work/fp8.jsonl"; exit 1; }
fp32_seconds=$(grep '"event":"end"' "$fp32_metrics" | sed -E 's/.*"elapsed_s":([-0-9.eE+]+).*/\1/')
echo "fp32: final test accuracy $fp32 in ${fp32_seconds:-?} s (e2e.fashion_mnist_accuracy's run)"
echo "fp8: final test accuracy $fp8 in $fp8_seconds s"
grep ' fp8 ' "$work/fp8.log" | tail -n 1  # the logged layer's scales, amaxes and error against bf16
[[ -n $fp32_seconds ]] && awk -v a="$fp8_seconds" -v b="$fp32_seconds" 'BEGIN {
  printf "fp8 (CPU emulation) took %.2fx the fp32 run'"'"'s time\n", a / b }'
awk -v a="$fp8" -v b="$fp32" -v g="$max_gap" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= g) }' ||
  { echo "FAIL: fp8 accuracy $fp8 is more than $max_gap from fp32's $fp32"; exit 1; }
echo "OK: fp8 accuracy $fp8 is within $max_gap of fp32's $fp32"
