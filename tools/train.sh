#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains a Vision Transformer on Fashion-MNIST
# (build/bin/train_vit with its defaults). Arguments go to train_vit (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset default --log-level=WARNING >/dev/null
cmake --build --preset default -j "$(nproc)" --target train_vit
exec build/bin/train_vit "$@"
