#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains.
# Until the ViT lands this runs the spiral MLP demo; arguments go to the program (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset default --log-level=WARNING >/dev/null
cmake --build --preset default -j "$(nproc)" --target train_demo
exec build/bin/train_demo "$@"
