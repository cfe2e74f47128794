#!/usr/bin/env bash
# Bad checkpoints and resume flags: one clear line on stderr, a non-zero exit, no crash, and
# the files involved left exactly as they were. Also --device gpu on this GPU-less machine, --amp on the CPU
# and --test-only.
# Usage: checkpoint_errors.sh <train>
set -uo pipefail
train=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
small=(--limit-train 128 --limit-val 16 --batch-size 32 --epochs 1 --img-size 32 --threads 1
       --workers 0 --print-freq 100)

# expect <exit code> <text in stderr> [max stderr lines] -- train args...
expect() {
  local code=$1 text=$2 max_lines=1
  shift 2
  if [ "$1" != "--" ]; then max_lines=$1; shift; fi
  shift
  "$train" "$@" >"$work/out" 2>"$work/err"
  local got=$? lines
  lines=$(wc -l <"$work/err")
  if [ "$got" -ne "$code" ] || ! grep -qF -- "$text" "$work/err" || [ "$lines" -gt "$max_lines" ] ||
     [ "$lines" -eq 0 ]; then
    echo "FAIL: train $* -> exit $got (want $code), stderr ($lines lines, want '$text'):"
    cat "$work/err"
    fail=1
  else
    echo "ok: exit $got: $(tail -1 "$work/err" | cut -c1-220)"
  fi
}
unchanged() {  # unchanged <what> <file> <copy>
  if cmp -s "$2" "$3"; then echo "ok: $1 left untouched"; else echo "FAIL: $1 was modified"; fail=1; fi
}

# Checkpoints to work with: a small model (one per step, kept), and a large one.
"$train" "${small[@]}" --checkpoint-dir "$work/ck" --step-interval 1 --max-num-checkpoints 0 \
  --output-dir "$work/weights" >"$work/setup.out" 2>&1 || { echo "setup run failed"; cat "$work/setup.out"; exit 1; }
"$train" "${small[@]}" --limit-train 32 --model mobilenet_v3_large --checkpoint-dir "$work/ck_large" \
  >"$work/setup_large.out" 2>&1 || { echo "setup run (large) failed"; cat "$work/setup_large.out"; exit 1; }
ls "$work/ck"

expect 1 "--resume $work/none.ckpt: no such file or directory" -- "${small[@]}" --resume "$work/none.ckpt"
expect 2 "--resume auto needs --checkpoint-dir" -- "${small[@]}" --resume auto
expect 2 "--pretrained and --resume exclude each other" -- "${small[@]}" --resume auto \
  --checkpoint-dir "$work/ck" --pretrained "$work/ck/best.ckpt"
expect 2 "--test-only needs --pretrained or --resume" -- "${small[@]}" --test-only

# A flipped bit: the checksum catches it, and the file stays as it was.
cp "$work/ck/step_2.ckpt" "$work/bad.ckpt"
printf '\x55' | dd of="$work/bad.ckpt" bs=1 seek=$(($(stat -c %s "$work/bad.ckpt") - 40)) conv=notrunc status=none
cp "$work/bad.ckpt" "$work/bad.copy"
expect 1 "checkpoint $work/bad.ckpt is corrupt: checksum" -- "${small[@]}" --resume "$work/bad.ckpt"
unchanged "the corrupt checkpoint" "$work/bad.ckpt" "$work/bad.copy"

# A torn (truncated) file.
head -c 20 "$work/ck/step_2.ckpt" >"$work/torn.ckpt"
expect 1 "torn.ckpt: header length" -- "${small[@]}" --resume "$work/torn.ckpt"
head -c 6000000 "$work/ck/step_2.ckpt" >"$work/torn.ckpt"
expect 1 "(truncated?)" -- "${small[@]}" --resume "$work/torn.ckpt"

# Another model: the mismatches are listed, for --resume and for --pretrained alike.
expect 1 "holds a mobilenet_v3_large model that does not fit this MobileNetV3 (nothing was loaded):" -- \
  "${small[@]}" --resume "$work/ck_large/model_0.ckpt"
grep -qE "missing from the checkpoint \(features\..*unexpected \(features\..*mis-shaped \(" "$work/err" &&
  echo "ok: the mismatches are listed by name" || { echo "FAIL: no list of mismatches"; fail=1; }
expect 1 "does not fit this MobileNetV3" -- "${small[@]}" --pretrained "$work/ck_large/model_0.ckpt"

# A plain weights file is not a checkpoint (but is fine as --pretrained).
expect 1 "is not a dpar checkpoint" -- "${small[@]}" --resume "$work/weights/mobilenet_v3_small.safetensors"

# Continuing with another seed cannot be exact; mid-epoch in other data (another epoch length
# at the same world size and batch) has no position to continue from.
expect 2 "resume with --seed 0" -- "${small[@]}" --resume "$work/ck/step_2.ckpt" --seed 9
expect 2 "stopped inside epoch 0 (step 2)" -- "${small[@]}" --resume "$work/ck/step_2.ckpt" \
  --limit-train 96
# Mid-epoch with another batch size continues at the same sample of the epoch's order.
if "$train" "${small[@]}" --resume "$work/ck/step_2.ckpt" --batch-size 16 \
     --checkpoint-dir "$work/ck_b16" >"$work/out" 2>"$work/err" &&
   grep -q "training continues at global step 2 and at sample 64 of epoch 0's order" "$work/out"; then
  echo "ok: mid-epoch resume with another batch size continues at sample 64"
else
  echo "FAIL: mid-epoch resume with --batch-size 16:"; cat "$work/out" "$work/err"; fail=1
fi

# A fresh start must not overwrite an earlier run's checkpoints.
(cd "$work/ck" && md5sum ./*) >"$work/before.md5"
expect 1 "already holds 6 checkpoint(s)" -- "${small[@]}" --checkpoint-dir "$work/ck"
(cd "$work/ck" && md5sum ./*) >"$work/after.md5"
unchanged "the earlier run's checkpoint directory" "$work/before.md5" "$work/after.md5"

# Every checkpoint in the directory unusable: a warning per file, then the error.
mkdir "$work/allbad"
cp "$work/bad.ckpt" "$work/allbad/step_1.ckpt"
cp "$work/torn.ckpt" "$work/allbad/step_2.ckpt"
expect 1 "no valid checkpoint in $work/allbad: 2 file(s), all unusable" 3 -- "${small[@]}" \
  --checkpoint-dir "$work/allbad" --resume auto

# With --test-only the checkpoint is evaluated and nothing is trained.
if "$train" "${small[@]}" --test-only --resume "$work/ck/latest.ckpt" \
  >"$work/out" 2>"$work/err"; then
  for text in "resumed from $work/ck/latest.ckpt" "[Eval][Epoch 0][Avg] loss:"; do
    grep -qF -- "$text" "$work/out" && echo "ok: $text" || { echo "FAIL: no '$text'"; cat "$work/out"; fail=1; }
  done
  grep -q "^\[Epoch" "$work/out" && { echo "FAIL: --test-only trained"; fail=1; }
else
  echo "FAIL: --test-only exited non-zero"; cat "$work/err"; fail=1
fi
# --amp fp16 on the CPU, bf16 on a CPU without AVX512-BF16 (oneDNN capped below it here), or an
# unknown precision: one line, exit 2, nothing trained in its place.
expect 2 "train: --amp=fp16: fp16 mixed precision runs on a GPU (--device gpu)" -- "${small[@]}" --amp fp16
ONEDNN_MAX_CPU_ISA=AVX512_CORE expect 2 "train: --amp=bf16 on the CPU needs AVX512-BF16 (oneDNN's bf16 kernels), which oneDNN does not find" -- \
  "${small[@]}" --amp bf16
expect 2 "train: --amp=fp8: expected fp16 or bf16" -- "${small[@]}" --amp fp8
# --device gpu without a usable GPU (these machines): one line saying why, before any data is
# read ("built without CUDA" in a CPU-only build, "no CUDA device" in a CUDA build).
expect 2 "train: --device gpu: device cuda:0 is not available: " -- "${small[@]}" --device gpu
expect 2 "train: --device gpu:3: device cuda:3 is not available: " -- "${small[@]}" --device gpu:3
expect 2 "--device=tpu: expected cpu, gpu or gpu:<index>" -- "${small[@]}" --device tpu
exit $fail
