#!/usr/bin/env bash
# The ViT example end to end on a slice of Fashion-MNIST: one process (checkpoints, TensorBoard
# file, ONNX export that ONNX's checker accepts), a second run into the same folder (refused),
# --resume (continues at the next epoch), and two ranks under dpar-launch (DataParallel).
#   vit_example.sh <train_vit> <dpar-launch> <python3> <infer> <image>
set -u
train=$1
launcher=$2
python=$3
infer=$4
image=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; failed=1; }
small=(--limit-train 512 --limit-test 200 --batch-size 64 --threads 1)

"$train" "${small[@]}" --epochs 1 --out "$work/run" >"$work/one.txt" 2>&1 || { cat "$work/one.txt"; fail "single process"; }
grep -q "^epoch 0: loss .*top-1" "$work/one.txt" && ok "an epoch with its top-1" || fail "no epoch line: $(cat "$work/one.txt")"
ls "$work/run/checkpoints/model_0.ckpt" >/dev/null 2>&1 && ok "checkpoint model_0.ckpt" || fail "no checkpoint"
ls "$work/run/tensorboard/"events.out.tfevents.* >/dev/null 2>&1 && ok "TensorBoard event file" || fail "no event file"
if "$python" -c "import onnx, sys; m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); \
assert m.opset_import[0].version == 17; assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim][1:] == [1, 32, 32]" \
    "$work/run/export/inference.onnx"; then
  ok "export/inference.onnx: checker, opset 17, input [batch, 1, 32, 32]"
else
  fail "the exported model"
fi

# dpar::infer classifies with the export (the node-by-node path; one grey channel).
"$infer" --model-dir "$work/run/export" --img-path "$image" --topk 3 >"$work/infer.txt" 2>&1 ||
  { cat "$work/infer.txt"; fail "infer"; }
grep -q "class_id: [0-9], prob: 0\.[0-9]*, topk_class_ids: \[" "$work/infer.txt" &&
  ok "infer classifies with the exported ViT" || fail "infer output: $(cat "$work/infer.txt")"

if "$train" "${small[@]}" --epochs 1 --out "$work/run" >"$work/again.txt" 2>&1; then
  fail "a second run into the same folder was not refused"
else
  grep -q "already holds .* checkpoint(s) of an earlier run" "$work/again.txt" && ok "second run refused" ||
    fail "refusal text: $(cat "$work/again.txt")"
fi
"$train" "${small[@]}" --epochs 2 --out "$work/run" --resume --export=false >"$work/resume.txt" 2>&1 ||
  { cat "$work/resume.txt"; fail "--resume"; }
grep -q "^epoch 1:" "$work/resume.txt" && ! grep -q "^epoch 0:" "$work/resume.txt" && ok "--resume continues at epoch 1" ||
  fail "resume output: $(cat "$work/resume.txt")"

source "$(dirname "${BASH_SOURCE[0]}")/../port_block.sh"
take_port_block || exit 1
"$launcher" --nproc_per_node=2 --start_port=$port --log_dir="$work/logs" "$train" "${small[@]}" \
  --epochs 1 --out "$work/run2" --export=false >"$work/two.txt" 2>&1 || { cat "$work/two.txt"; fail "2 ranks"; }
grep -q "train_vit: ViT-Tiny (.* parameters), 2 rank(s)" "$work/two.txt" && grep -q "^epoch 0:" "$work/two.txt" &&
  ok "2 ranks under dpar-launch" || fail "2-rank output: $(cat "$work/two.txt")"
[ $failed -eq 0 ] && echo "all checks passed"
exit $failed
