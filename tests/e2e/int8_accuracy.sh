#!/usr/bin/env bash
# int8 post-training quantization end to end: MobileNetV3-small trained by the example with its
# defaults (3 epochs over the 60000 Fashion-MNIST training images at 32 px, 1 thread: about
# 75 s on an AVX-512 machine, and the whole test 313 s alone on a 2-core AVX2 one; ~89 % top-1),
# exported in fp32 and in int8 (export_model --precision int8, calibrated on 8 batches of 32
# training images, the default percentile ranges) with the same preprocessing flags. Checks:
#   1. the int8 file passes the ONNX checker and strict shape inference, carries the fp32
#      file's metadata plus precision: int8, and its numpy QDQ evaluation (qdq_eval.py) agrees
#      with the f32 model's top-1 on >= 95 % of 500 test images;
#   2. on dpar::infer (eval_onnx), the int8 model's top-1 on all 10000 test images is within
#      1.0 point of the fp32 model's.
#   int8_accuracy.sh <train> <export_model> <eval_onnx> <python> <repository root>
set -uo pipefail
train=$1 export_model=$2 eval_onnx=$3 python=$4 root=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

if ! "$train" --epochs 3 --batch-size 64 --img-size 32 --threads 1 \
     --output-dir "$work/run" --export=false --print-freq 1000 >"$work/train.log" 2>&1; then
  echo "FAIL: train exited $?:"; tail -5 "$work/train.log"; exit 1
fi
grep "^final" "$work/train.log"
common=(--pretrained "$work/run/mobilenet_v3_small.safetensors" --img-size 32 --resize-size 32
        --mean 0.286,0.286,0.286 --std 0.353,0.353,0.353)
"$export_model" "${common[@]}" --save-inference-dir "$work/fp32" >/dev/null || exit 1
"$export_model" "${common[@]}" --save-inference-dir "$work/int8" --precision int8 \
  --calib-data fashion-mnist --calib-batches 8 || exit 1

# ---- 1. the file: checker, metadata, numpy QDQ evaluation against the f32 model -------------
"$eval_onnx" --limit 500 --dump "$work/x.safetensors" --dump-count 500 "$work/fp32/inference.onnx" \
  >/dev/null || exit 1
"$python" "$root/tests/parity/qdq_eval.py" --model "$work/int8/inference.onnx" \
  --fp32 "$work/fp32/inference.onnx" --images "$work/x.safetensors" --min-agreement 0.95 \
  2>/dev/null || fail=1
"$python" - "$work/fp32/inference.onnx" "$work/int8/inference.onnx" <<'PY' || fail=1
import sys, onnx
f, q = ({p.key: p.value for p in onnx.load(path).metadata_props} for path in sys.argv[1:])
extra = {k: v for k, v in q.items() if k not in f}
changed = [k for k in f if q.get(k) != f[k]]
ok = not changed and q.get("precision") == "int8" and set(extra) == {"precision", "quantization"}
print(("ok" if ok else "FAIL") + f": int8 metadata = fp32 metadata + {sorted(extra)}"
      + (f", changed: {changed}" if changed else ""))
sys.exit(0 if ok else 1)
PY

# ---- 2. top-1 on the 10k test images with dpar::infer -------------------------------------------
"$eval_onnx" "$work/fp32/inference.onnx" "$work/int8/inference.onnx" | tee "$work/eval.txt" ||
  exit 1
fp32=$(sed -n 1p "$work/eval.txt" | sed 's/.*top-1 \([0-9.]*\) %.*/\1/')
int8=$(sed -n 2p "$work/eval.txt" | sed 's/.*top-1 \([0-9.]*\) %.*/\1/')
grep -q "precision int8" "$work/eval.txt" || { echo "FAIL: the int8 model does not load as int8"; fail=1; }
if awk -v a="$fp32" -v b="$int8" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1.0 && a >= 75) }'; then
  echo "ok: int8 top-1 $int8 % vs fp32 $fp32 % (within 1.0 point)"
else
  echo "FAIL: int8 top-1 $int8 % vs fp32 $fp32 % (more than 1.0 point apart, or fp32 < 75 %)"; fail=1
fi
exit $fail
