#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, and train MobileNetV3-small
# with data parallelism on 2 local CPU ranks started by dpar-launch, on a Fashion-MNIST
# subset (Debian's dataset-fashion-mnist). Prints the launcher's environment table, the
# DataParallel bucket layout, per-iteration logs of rank 0, validation accuracy after each
# epoch and the final accuracy; rank 0 saves the weights.
# Extra arguments go to the training program (e.g. scripts/demo.sh --epochs 5).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

build=${DPAR_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target train dpar-launch

out=${DPAR_DEMO_OUT:-out/demo}
mkdir -p "$out"
echo "== data-parallel training: mobilenet_v3_small, 2 ranks x batch 64, 30000 Fashion-MNIST images (32x32)"
"$build/launch/dpar-launch" --nproc_per_node=2 --log_dir="$out/log" \
  "$build/examples/mobilenetv3/train" \
  --model mobilenet_v3_small \
  --data-path /usr/share/datasets/fashion-mnist \
  --limit-train 30000 --limit-val 5000 \
  --img-size 32 --epochs 3 --batch-size 64 --lr 0.1 \
  --print-freq 50 --output-dir "$out" "$@"
