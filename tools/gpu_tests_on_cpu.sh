#!/usr/bin/env bash
# The GPU suite's dry run, for a machine without a GPU: runs each test of test_cuda in its own process
# with OCTET_GPU_TESTS_ON_CPU=1, under which nothing skips and the CPU stands in for the GPU
# (tests/cuda/cuda_testing.h). A test then fails in one of three ways:
#   - it needs a GPU, and throws saying so (no CUDA device, NCCL on the CPU, ...): expected;
#   - an assertion that only a GPU meets fails (a result on the GPU, a kernel launch counted, ...):
#     expected, not judged here;
#   - anything else it throws, or a crash: reported. Most often the test's own setup or its CPU
#     reference calls the API with arguments the API has since refused, which on a GPU machine would
#     fail the test before its GPU part runs. Fix these before a GPU machine's time is spent.
# Exits 1 when any test is reported. A few minutes on 2 cores, after a build with CUDA on.
#   bash tools/gpu_tests_on_cpu.sh [BUILD_DIR (default build)] [GTEST_FILTER (default *)]
set -euo pipefail
build=${1:-build}
filter=${2:-*}
[[ -f $build/CMakeCache.txt ]] || { echo "gpu_tests_on_cpu: no build at '$build'; configure one first (cmake --preset default)"; exit 2; }
grep -q '^OCTET_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "gpu_tests_on_cpu: '$build' has CUDA off; the GPU tests build only with the CUDA toolkit (nvcc) present"; exit 2; }
cmake --build "$build" --target test_cuda -j "$(nproc)"
program=$build/bin/test_cuda
export OCTET_GPU_TESTS_ON_CPU=1

# Exceptions that say the test needs a GPU, or that the CPU refuses by design what the GPU does.
needs_gpu='CUDA device\(s\)|NCCL runs on CUDA devices|^cuda[A-Za-z]*: cudaError|DevicePrefetcher: device is cpu'
by_design='cross_entropy_forward: target .* is not a class index'  # the GPU gives the row a NaN loss instead

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mapfile -t tests < <("$program" --gtest_list_tests --gtest_filter="$filter" | awk '/^[^ ]/ { s = $1 } /^  / { print s $1 }')
passed=0 gpu_only=0 needs=0 reported=0
for t in "${tests[@]}"; do
  rc=0
  timeout 300 "$program" --gtest_filter="$t" > "$work/log" 2>&1 || rc=$?
  if ((rc == 0)); then
    passed=$((passed + 1))
    continue
  fi
  thrown=$(grep -o 'C++ exception with description "[^"]*"' "$work/log" | sed 's/^C++ exception with description "//; s/"$//' || true)
  others=$(grep -Ev "$needs_gpu|$by_design" <<< "$thrown" | sed '/^$/d' || true)
  if ((rc > 1)); then
    reported=$((reported + 1))
    echo "REPORT $t: ended with status $rc ($( ((rc == 124)) && echo "timed out after 300 s" || echo "a crash"))"
    tail -n 5 "$work/log" | sed 's/^/    /'
  elif [[ -n $others ]]; then
    reported=$((reported + 1))
    echo "REPORT $t: threw"
    echo "    ${others//$'\n'/$'\n'    }"
  elif [[ -n $thrown ]]; then
    needs=$((needs + 1))
  else
    gpu_only=$((gpu_only + 1))
  fi
done
echo "gpu_tests_on_cpu: ${#tests[@]} tests: $passed passed on the CPU, $needs stopped where they need a GPU," \
  "$gpu_only failed assertions only a GPU meets, $reported reported above"
((reported == 0))
