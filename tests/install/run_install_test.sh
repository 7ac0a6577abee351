#!/usr/bin/env bash
# Installs a build of Octet into a fresh prefix, then configures, builds and runs tests/install/consumer
# against it the way an outside project would (find_package(octet), octet::octet), with the same
# compiler and generator. CTest runs it as the `install` test (tests/CMakeLists.txt):
#   run_install_test.sh <octet build dir> <cmake> <generator> <make program> <c++ compiler> [launcher]
set -euo pipefail
build_dir=$1 cmake=$2 generator=$3 make_program=$4 cxx=$5 launcher=${6:-}
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/octet-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== cmake --install $build_dir --prefix $work/prefix"
"$cmake" --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"

# The installed package must stand on its own: nothing in it may point back into the source tree.
if grep -rl "$source_dir" "$work/prefix/lib/cmake/octet"; then
  echo "FAIL: the installed CMake files above refer to the source tree $source_dir" >&2
  exit 1
fi

echo "== configure and build the consumer against $work/prefix"
"$cmake" -S "$here/consumer" -B "$work/build" -G "$generator" -DCMAKE_MAKE_PROGRAM="$make_program" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"} \
  -DCMAKE_PREFIX_PATH="$work/prefix" --log-level=WARNING
"$cmake" --build "$work/build"

echo "== run it"
"$work/build/train_mlp" "$work/weights.safetensors"
