#!/usr/bin/env bash
# Installs what is missing, builds, and runs the tests through CTest.
#   bash tools/test.sh                 every test, CUDA on when nvcc is present (GPU tests skip without a GPU)
#   bash tools/test.sh cpu -L cpu      a CPU-only build, cpu-labelled tests
#   bash tools/test.sh asan -L cpu     the cpu tests under AddressSanitizer + UndefinedBehaviorSanitizer
# Presets are in CMakePresets.json; arguments after the preset go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

preset=${1:-default}
shift || true
cmake --preset "$preset" --log-level=WARNING
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)" "$@"
