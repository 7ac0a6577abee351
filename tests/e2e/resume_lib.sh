# Shared by the bf16 and fp8 resume tests (sourced): compare a run's losses with a resumed run's.

# "step loss" per line from a --metrics file's step events.
losses() { grep '"event":"step"' "$1" | sed -E 's/.*"loss":([^,]+),.*"step":([0-9]+).*/\2 \1/'; }

# expect_resumed_matches WORK LABEL: $WORK/a.jsonl (8 steps, uninterrupted) against $WORK/c.jsonl
# (resumed at step 4): the last 4 losses must be identical. Leaves a.txt and c.txt in WORK.
expect_resumed_matches() {
  local work=$1 label=$2
  losses "$work/a.jsonl" > "$work/a.txt"
  losses "$work/c.jsonl" > "$work/c.txt"
  [[ $(wc -l < "$work/a.txt") -eq 8 ]] || { echo "FAIL: expected 8 step events in a.jsonl"; exit 1; }
  [[ $(wc -l < "$work/c.txt") -eq 4 ]] || { echo "FAIL: expected 4 step events after resuming"; exit 1; }
  if ! diff <(tail -n 4 "$work/a.txt") "$work/c.txt" > "$work/ac.diff"; then
    echo "FAIL: the resumed $label run differs from the uninterrupted one:"; head "$work/ac.diff"; exit 1
  fi
}
