#!/usr/bin/env bash
# export_model end to end: torchvision weights (random, BatchNorm statistics perturbed) saved
# as .safetensors are exported; the ONNX file must pass the checker and match PyTorch within
# 1e-4 (tests/parity/onnx_check.py), and an int8 (QDQ) export calibrated on an image folder
# passes the checker. With the train program given, a training checkpoint is
# exported too (the same file as from the run's .safetensors). Then bad input: one clear line
# on stderr, exit 1 (or 2 for usage errors), no crash, and an earlier export in the target
# directory left untouched.
#   export_model.sh <export_model> <python with torch and onnx> <repository root> [<train>]
set -uo pipefail
tool=$1 python=$2 root=$3 train=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

"$python" "$root/tests/parity/fixtures_export.py" --seed 3 --out "$work/fx" || exit 1
weights=$work/fx/export_small_state.safetensors
names=zero,one,two,three,four,five,six,seven,eight,nine

# ---- a good export, checked against PyTorch ------------------------------------------------
if "$tool" --model mobilenet_v3_small --pretrained "$weights" --img-size 64 \
     --save-inference-dir "$work/out" --class-names "$names" >"$work/log" 2>&1; then
  cat "$work/log"
else
  echo "FAIL: export_model exited $?:"; cat "$work/log"; exit 1
fi
"$python" "$root/tests/parity/onnx_check.py" --model "$work/out/inference.onnx" \
  --ref "$work/fx/export_small_ref.safetensors" --output probs --tol 1e-4 \
  --meta model_name=mobilenet_v3_small num_classes=10 input_size=64 resize_size=73 \
    softmax=true "class_names=$names" mean=0.485,0.456,0.406 std=0.229,0.224,0.225 || fail=1
grep -q '"num_classes": 10' "$work/out/inference.json" || { echo "FAIL: inference.json"; fail=1; }
"$tool" --pretrained "$weights" --img-size 64 --no-softmax --save-inference-dir "$work/logits" \
  >/dev/null || { echo "FAIL: --no-softmax export"; fail=1; }
"$python" "$root/tests/parity/onnx_check.py" --model "$work/logits/inference.onnx" \
  --ref "$work/fx/export_small_ref.safetensors" --output logits --meta softmax=false \
  | tail -2 || fail=1

# ---- int8 (QDQ) with an image-folder calibration set and the percentile method ---------------
"$python" - "$work/calib" <<'PY' || { echo "FAIL: could not write the calibration images"; fail=1; }
import os, sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for c in ("cat", "dog"):
    os.makedirs(f"{sys.argv[1]}/train/{c}")
    for i in range(3):
        Image.fromarray((rng.random((80, 70, 3)) * 255).astype(np.uint8)).save(
            f"{sys.argv[1]}/train/{c}/{i}.png")
PY
if "$tool" --pretrained "$weights" --img-size 64 --save-inference-dir "$work/int8" \
     --class-names "$names" --precision int8 --calib-data "$work/calib" --calib-batches 2 \
     --calib-batch-size 2 --calib-method percentile --calib-percentile 99.9 >"$work/log" 2>&1 &&
   grep -q "calibrated on 4 images of $work/calib" "$work/log"; then
  cat "$work/log"
  "$python" - "$work/int8/inference.onnx" <<'PY' || fail=1
import sys, onnx
m = onnx.load(sys.argv[1])
onnx.checker.check_model(m, full_check=True)
onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
meta = {p.key: p.value for p in m.metadata_props}
ops = [n.op_type for n in m.graph.node]
ok = (meta.get("precision") == "int8" and "percentile 99.9" in meta.get("quantization", "")
      and ops.count("QuantizeLinear") == 54 and ops.count("DequantizeLinear") == 108
      and meta.get("class_names", "").startswith("zero,one"))
print(("ok" if ok else "FAIL") + ": int8 export passes the ONNX checker, precision "
      f"{meta.get('precision')}, {ops.count('QuantizeLinear')} QuantizeLinear")
sys.exit(0 if ok else 1)
PY
else
  echo "FAIL: int8 export:"; cat "$work/log"; fail=1
fi

# ---- a training checkpoint (model part) exports like the run's weights file -----------------
ckpt=
if [ -n "$train" ]; then
  if "$train" --limit-train 64 --limit-val 16 --epochs 1 --batch-size 32 --img-size 32 \
       --output-dir "$work/run" --checkpoint-dir "$work/run/ckpt" --export=false \
       >"$work/train.log" 2>&1; then
    ckpt=$work/run/ckpt/latest.ckpt
    # The class names are given: a checkpoint records the data's, a weights file none.
    "$tool" --pretrained "$ckpt" --img-size 32 --class-names "$names" \
      --save-inference-dir "$work/from_ckpt" >/dev/null &&
      "$tool" --pretrained "$work/run/mobilenet_v3_small.safetensors" --img-size 32 \
        --class-names "$names" --save-inference-dir "$work/from_weights" >/dev/null || fail=1
    if cmp -s "$work/from_ckpt/inference.onnx" "$work/from_weights/inference.onnx"; then
      echo "ok: export from $ckpt is byte-identical to the export from the run's weights"
    else
      echo "FAIL: exports from the checkpoint and from the weights differ"; fail=1
    fi
  else
    echo "FAIL: train exited $?:"; tail -5 "$work/train.log"; fail=1
  fi
fi

# ---- bad input -------------------------------------------------------------------------------
keep=$work/out/inference.onnx
sum_before=$(md5sum <"$keep")
expect() {  # expect <exit code> <text in stderr> -- args...
  local code=$1 text=$2; shift 3
  "$tool" "$@" >"$work/stdout" 2>"$work/err"
  local got=$?
  local lines
  lines=$(wc -l <"$work/err")
  if [ "$got" -ne "$code" ] || ! grep -qF -- "$text" "$work/err" || [ "$lines" -ne 1 ]; then
    echo "FAIL: export_model $* -> exit $got (want $code), stderr ($lines lines):"
    cat "$work/err"; fail=1
  else
    echo "ok: exit $got: $(cat "$work/err")"
  fi
}
head -c 100000 "$weights" >"$work/truncated.safetensors"
printf 'this is not a safetensors file' >"$work/garbage.safetensors"
large=$work/fx/export_large_state.safetensors
echo x >"$work/a_file"

expect 2 "--pretrained is required" -- --save-inference-dir "$work/out"
expect 2 "--model=resnet50: expected mobilenet_v3_small or mobilenet_v3_large" -- \
  --model resnet50 --pretrained "$weights" --save-inference-dir "$work/out"
expect 2 "--mean=1,2: expected 3 values" -- --pretrained "$weights" --mean 1,2 \
  --save-inference-dir "$work/out"
expect 2 "--precision=fp16: expected fp32 or int8" -- --pretrained "$weights" --precision fp16 \
  --save-inference-dir "$work/out"
expect 2 "--precision int8 needs --calib-data" -- --pretrained "$weights" --precision int8 \
  --save-inference-dir "$work/out"
expect 2 "--calib-data $work/nowhere: not a directory (or fashion-mnist)" -- --pretrained \
  "$weights" --precision int8 --calib-data "$work/nowhere" --save-inference-dir "$work/out"
expect 2 "--calib-method=kl: expected minmax or percentile" -- --pretrained "$weights" \
  --precision int8 --calib-data fashion-mnist --calib-method kl --save-inference-dir "$work/out"
expect 2 "--calib-percentile must be in (50, 100]" -- --pretrained "$weights" --precision int8 \
  --calib-data fashion-mnist --calib-percentile 30 --save-inference-dir "$work/out"
expect 2 "--calib-batches must be >= 1" -- --pretrained "$weights" --precision int8 \
  --calib-data fashion-mnist --calib-batches 0 --save-inference-dir "$work/out"
expect 2 "--calib-data needs --precision int8" -- --pretrained "$weights" \
  --calib-data fashion-mnist --save-inference-dir "$work/out"
expect 1 "--pretrained $work/missing.safetensors does not exist" -- \
  --pretrained "$work/missing.safetensors" --save-inference-dir "$work/out"
expect 1 "truncated.safetensors" -- --pretrained "$work/truncated.safetensors" \
  --save-inference-dir "$work/out"
expect 1 "garbage.safetensors" -- --pretrained "$work/garbage.safetensors" \
  --save-inference-dir "$work/out"
# Weights of another model: mobilenet_v3_large (7 classes) into mobilenet_v3_small.
expect 1 "does not fit mobilenet_v3_small with 7 classes: " -- --pretrained "$large" \
  --save-inference-dir "$work/out"
expect 1 "mis-shaped (classifier.3.weight" -- --pretrained "$weights" --num-classes 5 \
  --save-inference-dir "$work/out"
if [ -n "$ckpt" ]; then
  head -c 300000 "$ckpt" >"$work/truncated.ckpt"
  expect 1 "truncated.ckpt" -- --pretrained "$work/truncated.ckpt" --save-inference-dir "$work/out"
  # One byte flipped in the tensor data: the checksum catches it.
  cp "$ckpt" "$work/corrupt.ckpt"
  size=$(stat -c %s "$work/corrupt.ckpt")
  printf '\x55' | dd of="$work/corrupt.ckpt" bs=1 seek=$((size - 1000)) conv=notrunc 2>/dev/null
  expect 1 "corrupt.ckpt" -- --pretrained "$work/corrupt.ckpt" --save-inference-dir "$work/out"
  expect 1 "does not fit mobilenet_v3_large with 10 classes: " -- --model mobilenet_v3_large \
    --pretrained "$ckpt" --save-inference-dir "$work/out"
fi
expect 1 "3 class names for a model with 10 classes" -- --pretrained "$weights" --img-size 64 \
  --class-names a,b,c --save-inference-dir "$work/out"
expect 1 "cannot create output directory $work/a_file/inference" -- --pretrained "$weights" \
  --img-size 64 --save-inference-dir "$work/a_file/inference"
# A write that fails after the model file was written: nothing replaced, no temporary left.
mkdir "$work/out/inference.json.tmp"
expect 1 "cannot write $work/out/inference.json.tmp" -- --pretrained "$weights" --img-size 32 \
  --save-inference-dir "$work/out"
rmdir "$work/out/inference.json.tmp"
[ ! -e "$work/out/inference.onnx.tmp" ] || { echo "FAIL: temporary model file left"; fail=1; }
if [ "$(md5sum <"$keep")" != "$sum_before" ]; then
  echo "FAIL: a failed export changed $keep"; fail=1
else
  echo "ok: $keep unchanged by the failed exports"
fi
exit $fail
