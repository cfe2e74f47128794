#!/usr/bin/env bash
# The infer program end to end on a torch-exported MobileNetV3-small (10 classes) and three
# small images written here: the image lines (checked against PyTorch + torchvision's eval
# preprocessing), a single file, the benchmark report, and bad input (undecodable image,
# --use-gpu on a CPU build, missing / truncated model, bad flags, empty folder).
#   infer_tool.sh <infer binary> <python with torch, torchvision, onnx, PIL>
set -uo pipefail
infer=$1
python=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

# The model (BatchNorm statistics calibrated on random data so the outputs depend on the
# image, classifier sharpened), metadata as export_model writes it, the images, and for each
# image torch's top-1 class, its probability and its margin over the runner-up.
if ! "$python" - "$work" >"$work/expected.txt" 2>"$work/python.log" <<'EOF'
import os, sys
import numpy as np, onnx, torch, torchvision
from PIL import Image
work = sys.argv[1]
os.makedirs(work + "/model"); os.makedirs(work + "/imgs")
torch.manual_seed(0)
m = torchvision.models.mobilenet_v3_small(num_classes=10)
with torch.no_grad():
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = None
    m.train()
    for _ in range(3):
        m(torch.randn(8, 3, 224, 224))
    m.eval()
    m.classifier[3].weight.mul_(100)
net = torch.nn.Sequential(m, torch.nn.Softmax(1)).eval()
path = work + "/model/inference.onnx"
torch.onnx.export(net, torch.randn(1, 3, 224, 224), path, opset_version=14, input_names=["x"],
                  output_names=["probs"], dynamic_axes={"x": {0: "N"}, "probs": {0: "N"}})
model = onnx.load(path)
for k, v in {"model_name": "mobilenet_v3_small", "input_size": "224", "resize_size": "256",
             "mean": "0.485,0.456,0.406", "std": "0.229,0.224,0.225",
             "class_names": ",".join(f"c{i}" for i in range(10))}.items():
    e = model.metadata_props.add()
    e.key, e.value = k, v
onnx.save(model, path)
T = torchvision.transforms
tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
rng = np.random.default_rng(0)
for name, (w, h, mode) in {"a.jpg": (300, 200, "RGB"), "b.jpg": (64, 80, "L"),
                           "c.png": (500, 400, "RGB")}.items():
    base = (rng.random((h // 8 + 1, w // 8 + 1, 3)) * 255).astype(np.uint8)
    Image.fromarray(base).resize((w, h), Image.BILINEAR).convert(mode).save(
        f"{work}/imgs/{name}", **({"quality": 95} if name.endswith(".jpg") else {}))
    with torch.no_grad():
        p = net(tf(Image.open(f"{work}/imgs/{name}").convert("RGB")).unsqueeze(0))[0]
    top = p.topk(2).values
    print(name, int(p.argmax()), f"{float(top[0]):.6f}", f"{float(top[0] - top[1]):.6f}")
EOF
then
  echo "FAIL: could not build the test model and images:"; cat "$work/python.log"; exit 1
fi

run() {  # run <name> args...: stdout, stderr and status in $work/<name>.{out,err,rc}
  local name=$1; shift
  "$infer" "$@" >"$work/$name.out" 2>"$work/$name.err"
  echo $? >"$work/$name.rc"
}
expect_error() {  # expect_error <exit code> <text in stderr> -- args...
  local code=$1 text=$2; shift 3
  run err "$@"
  local got lines
  got=$(cat "$work/err.rc")
  lines=$(wc -l <"$work/err.err")
  if [ "$got" -ne "$code" ] || ! grep -qF -- "$text" "$work/err.err" || [ "$lines" -ne 1 ]; then
    echo "FAIL: infer $* -> exit $got (want $code), stderr ($lines lines):"; cat "$work/err.err"
    fail=1
  else
    echo "ok: infer $* -> exit $got: $(cat "$work/err.err")"
  fi
}

# 1. A folder in batches of 2 (the last batch has one image): one line per image, in name
# order, agreeing with PyTorch. The preprocessing differs slightly from PIL's (resampling), so
# probabilities agree to 5e-3 and classes wherever torch's top-1 leads by more than 0.02.
run folder --model-dir "$work/model" --img-path "$work/imgs" --batch-size 2 --cpu-threads 1 \
  --use-gpu=False
if [ "$(cat "$work/folder.rc")" -ne 0 ]; then
  echo "FAIL: folder run exited $(cat "$work/folder.rc")"; cat "$work/folder.err"; fail=1
fi
if ! "$python" - "$work/folder.out" "$work/expected.txt" "$work/imgs" <<'EOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
expected = [l.split() for l in open(sys.argv[2])]
pat = re.compile(r"^image_name: (\S+), class_id: (\d+), prob: (\d\.\d{6})$")
ok = len(lines) == len(expected)
for line, (name, cls, prob, margin) in zip(lines, expected):
    m = pat.match(line)
    good = (m is not None and m.group(1) == f"{sys.argv[3]}/{name}"
            and abs(float(m.group(3)) - float(prob)) <= 5e-3
            and (float(margin) <= 0.02 or int(m.group(2)) == int(cls)))
    print(("ok:   " if good else "FAIL: ") + line + f"   (torch: class {cls}, prob {prob})")
    ok = ok and good
sys.exit(0 if ok else 1)
EOF
then
  echo "FAIL: image lines (above) do not match PyTorch"; cat "$work/folder.out"; fail=1
fi

# 2. One file; top-3 with the metadata's class names.
run single --model-dir "$work/model/inference.onnx" --img-path "$work/imgs/c.png" --topk 3
if [ "$(cat "$work/single.rc")" -ne 0 ] || [ "$(wc -l <"$work/single.out")" -ne 1 ] ||
   ! grep -qE "^image_name: $work/imgs/c.png, class_id: [0-9], prob: [01]\.[0-9]{6}, topk_class_ids: \[[0-9], [0-9], [0-9]\], topk_probs: \[.*\], label_names: \[c[0-9], c[0-9], c[0-9]\]$" "$work/single.out"; then
  echo "FAIL: single image:"; cat "$work/single.out" "$work/single.err"; fail=1
else
  echo "ok: single image: $(cat "$work/single.out")"
fi

# 3. The benchmark report: every section and the figures tools look for.
run bench --model-dir "$work/model" --img-path "$work/imgs" --batch-size 2 --cpu-threads 1 \
  --benchmark=True --warmup 2
for want in "Env info" "OS_version: " "CUDA_version: not used" "CUDNN_version: not used" \
  "dpar_version: " "dpar_commit: " "Conf info" "runtime_device: cpu" "enable_mkldnn: True" \
  "mkldnn_version: oneDNN " "cpu_math_library_num_threads: 1" "Model info" \
  "model_name: mobilenet_v3_small" "precision: fp32" "Data info" "batch_size: 2" \
  "input_shape: 3,224,224" "data_num: 3" "Perf info" "cpu_rss(MB): " \
  "gpu_rss(MB): None, gpu_util: None%" "total time spent(s): " "preprocess_time(ms): " \
  "inference_time(ms): " "postprocess_time(ms): "; do
  if ! grep -qF -- "$want" "$work/bench.out"; then
    echo "FAIL: benchmark report lacks '$want'"; fail=1
  fi
done
if [ "$(cat "$work/bench.rc")" -ne 0 ] || [ "$(grep -c '^image_name: ' "$work/bench.out")" -ne 3 ]; then
  echo "FAIL: benchmark run:"; cat "$work/bench.out" "$work/bench.err"; fail=1
else
  echo "ok: benchmark report:"; sed -n '/Perf info/,$p' "$work/bench.out"
fi

# 4. Bad input: one clear line on stderr, non-zero exit.
mkdir "$work/mixed"
cp "$work/imgs/"* "$work/mixed/"
printf 'this is not a JPEG' >"$work/mixed/broken.jpg"
expect_error 1 "broken.jpg" -- --model-dir "$work/model" --img-path "$work/mixed"
if [ -n "$(grep -F broken "$work/err.out")" ]; then
  echo "FAIL: a line was printed for the undecodable image"; fail=1
fi
# Without a usable GPU: "device cuda:0 is not available: dpar was built without CUDA" in a
# CPU-only build, "...: no NVIDIA driver ..." / "no CUDA device" in a CUDA build.
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" = 0 ]; then
  expect_error 2 "--use-gpu=True: device cuda:0 is not available: " -- --model-dir "$work/model" \
    --img-path "$work/imgs" --use-gpu=True
fi
expect_error 1 "--model-dir $work/nothing: no such file or directory" -- \
  --model-dir "$work/nothing" --img-path "$work/imgs"
mkdir "$work/truncated"
head -c 100000 "$work/model/inference.onnx" >"$work/truncated/inference.onnx"
expect_error 1 "$work/truncated/inference.onnx: " -- --model-dir "$work/truncated" --img-path "$work/imgs"
expect_error 2 "--precision=fp16: half-precision inference runs on the GPU" -- --model-dir "$work/model" --img-path "$work/imgs" --precision fp16
expect_error 2 "--precision=fp8: expected fp32, fp16 (GPU) or int8 (CPU)" -- --model-dir "$work/model" --img-path "$work/imgs" --precision fp8
expect_error 2 "--precision=int8: $work/model/inference.onnx is an fp32 model" -- --model-dir "$work/model" --img-path "$work/imgs" --precision int8
expect_error 2 "--batch-size=0: expected >= 1" -- --model-dir "$work/model" --img-path "$work/imgs" --batch-size 0
mkdir "$work/empty"
expect_error 1 "has no images" -- --model-dir "$work/model" --img-path "$work/empty"
expect_error 1 "--crop-size=200 does not fit" -- --model-dir "$work/model" --img-path "$work/imgs" --crop-size 200
exit $fail
