#!/usr/bin/env bash
# The README's plot command, `python3 tools/plot_metrics.py m.jsonl -o runs.png`, on machines whose
# first python3 has no matplotlib (pyenv, conda and virtual environments come first on PATH and do not
# see Debian's python3-matplotlib):
#  - with a python3 that has it further down PATH, the command writes the PNG, as written;
#  - with none on PATH, it exits non-zero with one line that names the package to install, no traceback.
# The python3 without matplotlib is this machine's own python3 run with -E -S (no environment
# variables, no site-packages: the standard library alone), put first on PATH.
#
#   plot_metrics_python.sh WORK
set -euo pipefail
work=$1
here=$(cd "$(dirname "$0")" && pwd)
script=$here/../../tools/plot_metrics.py
metrics=$here/metrics/short_fp32.jsonl
rm -rf "$work" && mkdir -p "$work/bare"

# The interpreter itself, not a launcher such as pyenv's shim (which needs more of PATH than the test leaves).
real=$(python3 -c "import sys; print(sys.executable)") || { echo "FAIL: no python3 on PATH"; exit 1; }
printf '#!/bin/sh\nexec %s -E -S "$@"\n' "$real" > "$work/bare/python3"
chmod +x "$work/bare/python3"
if "$work/bare/python3" -c "import matplotlib" 2> /dev/null; then
  echo "FAIL: $work/bare/python3 ($real -E -S) imports matplotlib; the test needs a python3 without it"; exit 1
fi

# 1. The first python3 has no matplotlib; another on PATH does.
(cd "$work" && PATH="$work/bare:$PATH" python3 "$script" "$metrics" -o runs.png > first.out 2>&1) || {
  cat "$work/first.out"
  echo "FAIL: the plot command failed with $work/bare/python3 first on PATH (is python3-matplotlib installed?" \
       "bash tools/setup.sh installs it)"
  exit 1
}
cat "$work/first.out"
[[ $(head -c 8 "$work/runs.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  { echo "FAIL: $work/runs.png is not a PNG"; exit 1; }
size=$(stat -c %s "$work/runs.png")
((size > 20000)) || { echo "FAIL: $work/runs.png has $size bytes, too few for a figure of four panels"; exit 1; }

# 2. No python3 on PATH has matplotlib: one line naming the package, a non-zero exit, no picture.
set +e
(cd "$work" && PATH="$work/bare" python3 "$script" "$metrics" -o none.png > none.out 2>&1)
rc=$?
set -e
cat "$work/none.out"
((rc != 0)) || { echo "FAIL: exit status 0 without matplotlib"; exit 1; }
[[ $(wc -l < "$work/none.out") == 1 ]] || { echo "FAIL: $(wc -l < "$work/none.out") lines, expected one"; exit 1; }
grep -q "python3-matplotlib" "$work/none.out" || { echo "FAIL: the line does not name python3-matplotlib"; exit 1; }
if grep -q "Traceback" "$work/none.out"; then echo "FAIL: a traceback"; exit 1; fi
[[ ! -e $work/none.png ]] || { echo "FAIL: a picture was written without matplotlib"; exit 1; }
echo "PASS: the plot command writes the PNG with a python3 without matplotlib first on PATH (exit $rc and one line" \
     "without any)"
