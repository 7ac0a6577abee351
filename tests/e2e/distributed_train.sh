#!/usr/bin/env bash
# apps/examples/distributed_train.cpp, the README's data-parallel program, at 2 ranks under mpirun on
# the CPU, with DDP and with FSDP, for STEPS steps each. Each run must (1) exit 0, (2) end with a loss
# below 2.2 and (3) reach a test accuracy of at least MIN_ACCURACY % counted over all 10,000 test
# images by both ranks together. An untrained 10-class model sits at ln 10 = 2.303 and 10%; 20 steps
# of 2 × 128 images take it to about 1.85 and 40%. (4) FSDP must print DDP's loss and accuracy: on
# the CPU the two are the same computation, bit for bit (tests/e2e/fsdp_parity.sh).
#
#   distributed_train.sh DISTRIBUTED_TRAIN MPIRUN STEPS MIN_ACCURACY
set -euo pipefail
program=$1 mpirun=$2 steps=$3 min_accuracy=$4
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
declare -A lines
for mode in ddp fsdp; do
  status=0
  out=$("$mpirun" --oversubscribe --mca btl self,vader -np 2 "$program" "$mode" "$steps" 2>&1) || status=$?
  echo "$out"
  if ((status != 0)); then echo "FAIL: distributed_train $mode exited with $status"; exit 1; fi
  loss=$(sed -n "s/^step *$steps  loss \([0-9.]*\)$/\1/p" <<< "$out")
  accuracy=$(sed -n "s/^test accuracy \([0-9.]*\)% over 10000 images, 2 rank(s), $mode$/\1/p" <<< "$out")
  [[ -n $loss && -n $accuracy ]] || { echo "FAIL: $mode: no loss at step $steps or no 2-rank accuracy over 10000 images"; exit 1; }
  awk -v l="$loss" -v a="$accuracy" -v m="$min_accuracy" -v mode="$mode" 'BEGIN {
    if (l >= 2.2) { print "FAIL: " mode ": loss " l " at the last step, not below 2.2 (ln 10 = 2.303 untrained)"; exit 1 }
    if (a < m) { print "FAIL: " mode ": test accuracy " a "%, below " m "% (chance: 10%)"; exit 1 }
    print "distributed_train " mode ": loss " l ", test accuracy " a "%" }'
  lines[$mode]="$loss $accuracy"
done
[[ ${lines[ddp]} == "${lines[fsdp]}" ]] || { echo "FAIL: FSDP printed ${lines[fsdp]}, DDP ${lines[ddp]}"; exit 1; }
echo "distributed_train: FSDP and DDP agree"
