#!/usr/bin/env bash
# --gelu tanh trains the model with the tanh form of GELU: the start event records it, the losses
# differ from the erf form's (the flag reaches the model), the forward saves as many bytes for backward
# as the erf form's (the MLP as one node keeps fc1's input and output, as the modules with gelu_linear
# do, not the GELU's output), and --recompute blocks changes no bit, in fp32, bf16 and fp8. A form that does not
# exist is refused with both names.
#   gelu_tanh.sh TRAIN_VIT WORKDIR
set -euo pipefail
source "$(dirname "$0")/resume_lib.sh"
train_vit=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
saved() { python3 -c "import json,sys
print(next(e['memory_ledger']['saved_activations_bytes'] for e in map(json.loads, open(sys.argv[1]))
           if e.get('event') == 'step' and 'memory_ledger' in e))" "$1"; }
for precision in fp32 bf16 fp8; do
  run=("$train_vit" --precision "$precision" --dataset synthetic --synthetic-size 512 --batch-size 32
       --eval-batch-size 256 --steps 6 --warmup-steps 2 --seed 3 --log-every 1 --threads 2)
  "${run[@]}" --metrics "$work/$precision-erf.jsonl" > /dev/null
  "${run[@]}" --metrics "$work/$precision-tanh.jsonl" --gelu tanh > /dev/null
  "${run[@]}" --metrics "$work/$precision-tanh-recompute.jsonl" --gelu tanh --recompute blocks > /dev/null
  grep -q '"gelu":"tanh"' "$work/$precision-tanh.jsonl" || { echo "FAIL: the start event has no gelu tanh"; exit 1; }
  grep -q '"gelu":"erf"' "$work/$precision-erf.jsonl" || { echo "FAIL: the start event has no gelu erf"; exit 1; }
  for f in erf tanh tanh-recompute; do losses "$work/$precision-$f.jsonl" > "$work/$precision-$f.txt"; done
  [[ $(wc -l < "$work/$precision-tanh.txt") -eq 6 ]] || { echo "FAIL: expected 6 logged steps ($precision)"; exit 1; }
  if diff -q "$work/$precision-erf.txt" "$work/$precision-tanh.txt" > /dev/null; then
    echo "FAIL: $precision losses with --gelu tanh equal the erf form's: the flag did not reach the model"; exit 1
  fi
  diff "$work/$precision-tanh.txt" "$work/$precision-tanh-recompute.txt" > /dev/null ||
    { echo "FAIL: $precision --gelu tanh losses differ with --recompute blocks:"; paste "$work/$precision-tanh.txt" \
        "$work/$precision-tanh-recompute.txt"; exit 1; }
  # The figure is memory in use after the forward less before it, so a batch the loader's thread
  # prepares meanwhile (100,608 bytes here) can fall inside it. Keeping the GELU's output as well
  # would add 2.5 MB (4 blocks x 1600 tokens x 192 x 2 bytes in bf16), 19% of the whole: 5% separates.
  erf=$(saved "$work/$precision-erf.jsonl") tanh=$(saved "$work/$precision-tanh.jsonl")
  (( 20 * (tanh > erf ? tanh - erf : erf - tanh) <= erf )) ||
    { echo "FAIL: $precision saves $tanh bytes for backward with --gelu tanh, $erf with erf"; exit 1; }
  echo "$precision: tanh losses differ from erf's, equal with --recompute blocks; saved $tanh bytes (erf $erf)"
done
if "$train_vit" --gelu relu --steps 1 > "$work/relu.log" 2>&1; then echo "FAIL: --gelu relu was accepted"; exit 1; fi
grep -q "erf" "$work/relu.log" && grep -q "tanh" "$work/relu.log" ||
  { echo "FAIL: --gelu relu's error does not name erf and tanh:"; cat "$work/relu.log"; exit 1; }
echo "OK: --gelu tanh reaches the model, saves what erf saves, and recomputes bit for bit"
