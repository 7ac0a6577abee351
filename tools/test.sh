#!/usr/bin/env bash
# Installs what is missing, builds, and runs the tests through CTest.
#   bash tools/test.sh                 every test, CUDA on when nvcc is present (GPU tests skip without a GPU)
#   bash tools/test.sh cpu -L cpu      a CPU-only build, cpu-labelled tests (builds only what they run)
#   bash tools/test.sh asan -L cpu     the cpu tests under AddressSanitizer + UndefinedBehaviorSanitizer
# Presets are in CMakePresets.json; arguments after the preset go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

preset=${1:-default}
shift || true
cmake --preset "$preset" --log-level=WARNING
# With -L cpu, ctest runs the cpu-labelled tests only, so only their programs are built (the target
# cpu_tests, tests/CMakeLists.txt): the sanitizer pass then skips the apps and the mpi suites.
target=()
[[ " $* " == *" -L cpu "* ]] && target=(--target cpu_tests)
start=$SECONDS
cmake --build --preset "$preset" -j "$(nproc)" "${target[@]}"
echo "test.sh: the $preset build took $((SECONDS - start)) s"
start=$SECONDS
ctest --preset "$preset" -j "$(nproc)" "$@"
echo "test.sh: the $preset tests took $((SECONDS - start)) s"
