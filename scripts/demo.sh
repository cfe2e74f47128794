#!/usr/bin/env bash
# The main job on a fresh machine, in one command: install dependencies, build, prepare the
# lite data (demo.jpg), train MobileNetV3-small with data parallelism on 2 local CPU ranks
# started by dpar-launch on a Fashion-MNIST subset (Debian's dataset-fashion-mnist), export the
# inference model on rank 0 (ONNX, BatchNorm folded, Softmax appended), and classify demo.jpg
# with the exported model with the benchmark report, and draw the run from its TensorBoard
# event files (out/demo/run.png).
# Prints the launcher's environment table, the DataParallel bucket layout, per-iteration logs
# of rank 0, validation accuracy after each epoch, the export, the image's class and the report.
# Extra arguments go to the training program (e.g. scripts/demo.sh --epochs 5).
# Environment: DPAR_BUILD_DIR (default build), DPAR_DEMO_OUT (default out/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

build=${DPAR_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target train export_model infer dpar-launch make_lite_data

tipc=examples/mobilenetv3/test_tipc
echo "== lite data (test_tipc/prepare.sh): 16 train + 16 val JPEG images and demo.jpg"
DPAR_BUILD_DIR=$build "$tipc/prepare.sh" "$tipc/configs/mobilenet_v3_small/train_infer.txt" \
  lite_train_lite_infer

out=${DPAR_DEMO_OUT:-out/demo}
mkdir -p "$out"
echo "== data-parallel training: mobilenet_v3_small, 2 ranks x batch 64, 30000 Fashion-MNIST images (32x32)"
"$build/launch/dpar-launch" --nproc_per_node=2 --log_dir="$out/log" \
  "$build/examples/mobilenetv3/train" \
  --model mobilenet_v3_small \
  --data-path /usr/share/datasets/fashion-mnist \
  --limit-train 30000 --limit-val 5000 \
  --img-size 32 --epochs 3 --batch-size 64 --lr 0.1 \
  --print-freq 50 --output-dir "$out" --tensorboard "$out/tb" "$@"

echo "== rank-0 export: $out/inference/inference.onnx"
ls -l "$out/inference"

echo "== inference on $tipc/data/lite/demo.jpg (a Fashion-MNIST test image: T-shirt/top)"
"$build/examples/mobilenetv3/infer" --model-dir "$out/inference" \
  --img-path "$tipc/data/lite/demo.jpg" --topk 3 --benchmark=True --warmup 2

echo "== the run drawn from its TensorBoard event files ($out/tb; tensorboard --logdir $out/tb shows the same)"
/usr/bin/python3 scripts/plot_run.py "$out/tb" -o "$out/run.png" --title "dpar demo: mobilenet_v3_small, 2 ranks, Fashion-MNIST 32px"
