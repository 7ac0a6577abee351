#!/usr/bin/env bash
# apps/examples/minimal_train.cpp, the README's "complete program", trains for STEPS steps and must
# (1) exit 0, (2) end with a loss below 2.2 and (3) reach a test accuracy of at least MIN_ACCURACY %.
# An untrained 10-class model sits at a loss of ln 10 = 2.303 and an accuracy of 10% (chance); 20
# AdamW steps at 1e-3 take this model to about 1.9 and 35%. So a step that does not learn fails, as
# does a crash after the accuracy line was printed.
#
#   minimal_train.sh MINIMAL_TRAIN STEPS MIN_ACCURACY
set -euo pipefail
program=$1 steps=$2 min_accuracy=$3
status=0
out=$("$program" "$steps") || status=$?
if ((status != 0)); then echo "$out"; echo "FAIL: minimal_train exited with $status"; exit 1; fi
echo "$out"
loss=$(sed -n "s/^step *$steps  loss \([0-9.]*\)$/\1/p" <<< "$out")
accuracy=$(sed -n 's/^test accuracy \([0-9.]*\)%$/\1/p' <<< "$out")
[[ -n $loss && -n $accuracy ]] || { echo "FAIL: no loss at step $steps or no test accuracy in the output"; exit 1; }
awk -v l="$loss" -v a="$accuracy" -v m="$min_accuracy" 'BEGIN {
  if (l >= 2.2) { print "FAIL: loss " l " at the last step, not below 2.2 (ln 10 = 2.303 untrained)"; exit 1 }
  if (a < m) { print "FAIL: test accuracy " a "%, below " m "% (chance: 10%)"; exit 1 }
  print "minimal_train: loss " l ", test accuracy " a "%" }'
