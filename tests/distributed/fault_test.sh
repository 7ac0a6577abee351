#!/usr/bin/env bash
# A rank that throws must end the whole mpirun job: non-zero exit, in under 60 s, with a message that
# names the failing rank and the exception (issue 6, Faults).
#
#   fault_test.sh MPIRUN FAULT_PROGRAM NP FAILING_RANK all_reduce|barrier|broadcast|in_flight|subgroup [mpi|nccl]
#
# FAULT_PROGRAM is fault_rank_throws: every rank runs a few all_reduces, then FAILING_RANK throws
# std::runtime_error("injected failure") while the others wait in the named collective. The backend
# is MPI on the CPU (the default; CTest), or NCCL with every rank on GPU 0 (tools/gpu_check.sh's
# nccl_ranks stage, which also sets NCCL_MULTI_RANK_GPU_ENABLE=1).
set -u
if [ $# -ne 5 ] && [ $# -ne 6 ]; then
  echo "usage: $0 MPIRUN FAULT_PROGRAM NP FAILING_RANK all_reduce|barrier|broadcast|in_flight|subgroup [mpi|nccl]" >&2
  exit 2
fi
mpirun=$1 program=$2 np=$3 failing_rank=$4 collective=$5 backend=${6:-mpi}
limit_s=60

# OpenMPI refuses to start as root without these (containers, CI).
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT

start=$(date +%s.%N)
# The outer timeout only ends a hang (exit 124): a job still running after limit_s has failed already,
# so it waits 15 s past it, not longer (the GPU check runs these over NCCL inside a deadline).
hang_s=$((limit_s + 15))
timeout -k 10 "$hang_s" "$mpirun" --oversubscribe --bind-to none --mca btl self,vader -np "$np" \
  "$program" "$failing_rank" "$collective" "$backend" >"$log" 2>&1
status=$?
end=$(date +%s.%N)
elapsed=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }')

echo "---- mpirun -np $np $(basename "$program") $failing_rank $collective $backend: exit $status after ${elapsed} s ----"
cat "$log"
echo "----"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

if [ "$status" -eq 0 ]; then
  fail "the job exited 0 although rank $failing_rank threw"
elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  fail "the job hung: killed by the ${hang_s} s timeout (exit $status)"
fi
if ! awk -v e="$elapsed" -v l="$limit_s" 'BEGIN { exit !(e < l) }'; then
  fail "the job took ${elapsed} s to end; the limit is ${limit_s} s"
fi
# One line must name both the failing rank (as "rank R", not a prefix of "rank R0") and the exception:
# the message of run_rank_main, not merely a log prefix on some other line.
if ! grep -Eq "rank ${failing_rank}([^0-9]|\$).*injected failure|injected failure.*rank ${failing_rank}([^0-9]|\$)" "$log"; then
  fail "no line names both 'rank $failing_rank' and the exception 'injected failure'"
fi
if grep -q "finished without rank" "$log"; then
  fail "a collective finished without the failing rank"
fi

if [ "$failures" -gt 0 ]; then exit 1; fi
echo "PASS: rank $failing_rank's exception ended all $np ranks ($backend) in ${elapsed} s with exit $status"
