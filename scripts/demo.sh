#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, and train MobileNetV3-small
# in one process on a Fashion-MNIST subset (Debian's dataset-fashion-mnist), printing the
# per-iteration log, the validation accuracy after each epoch and the final accuracy.
# Extra arguments go to the training program (e.g. scripts/demo.sh --epochs 3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

build=${DPAR_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target train

out=${DPAR_DEMO_OUT:-out/demo}
mkdir -p "$out"
echo "== training mobilenet_v3_small on 12000 Fashion-MNIST images (32x32), validating on 2000"
"$build/examples/mobilenetv3/train" \
  --model mobilenet_v3_small \
  --data-path /usr/share/datasets/fashion-mnist \
  --limit-train 12000 --limit-val 2000 \
  --img-size 32 --epochs 2 --batch-size 64 --lr 0.1 \
  --print-freq 50 --output-dir "$out" "$@"
