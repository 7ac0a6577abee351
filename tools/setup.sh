#!/usr/bin/env bash
# Installs, through apt-get, the Debian packages Octet builds and runs with.
# Idempotent and quiet: when everything is present it prints nothing and exits 0.
# The CUDA toolkit (nvcc, cuBLASLt, cuDNN, NCCL) is expected to be installed already;
# without it the build falls back to OCTET_CUDA=OFF.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libspdlog-dev libfmt-dev          # logging
  libgtest-dev libgmock-dev         # tests
  libopenblas-dev                   # CPU GEMM
  zlib1g-dev                        # gzip'd IDX files
  libcli11-dev                      # command-line flags
  nlohmann-json3-dev                # metrics, checkpoint indices
  libopenmpi-dev openmpi-bin        # launch and the CPU process group
  dataset-fashion-mnist             # the main job's data
  xz-utils binutils                 # tools/gpu_bundle.sh: packing and reading the programs
  python3-matplotlib                # tools/plot_metrics.py: pictures of a run
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

echo "setup: installing ${missing[*]}"
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log"
  echo "setup: apt-get failed; the packages above are what Octet needs" >&2
  exit 1
fi
rm -f "$log"
