#!/usr/bin/env bash
# Bad input to the training program: one clear line on stderr, non-zero exit, no crash.
set -uo pipefail
train=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
expect() {  # expect <exit code> <text in stderr> -- args...
  local code=$1 text=$2; shift 3
  "$train" "$@" >"$work/out" 2>"$work/err"
  local got=$?
  local lines
  lines=$(wc -l <"$work/err")
  if [ "$got" -ne "$code" ] || ! grep -qF -- "$text" "$work/err" || [ "$lines" -ne 1 ]; then
    echo "FAIL: train $* -> exit $got (want $code), stderr ($lines lines):"; cat "$work/err"; fail=1
  else
    echo "ok: train $* -> exit $got: $(cat "$work/err")"
  fi
}
expect 2 "unknown flag --epoch" -- --epoch 3
expect 2 "--batch-size=abc: expected an integer" -- --batch-size=abc
expect 2 "--lr-scheduler=linear: expected cosine or step" -- --lr-scheduler=linear --limit-train 64 --limit-val 8
expect 2 "--opt=lamb: expected sgd, rmsprop or adamw" -- --opt lamb --limit-train 64 --limit-val 8
expect 2 "--grad-comm-dtype=int8: expected f32, bf16 or f16" -- --grad-comm-dtype int8 --limit-train 64 --limit-val 8
expect 2 "--dist-backend=mpi: expected nccl or gloo" -- --dist-backend mpi --limit-train 64 --limit-val 8
expect 1 "data path /nonexistent is not a directory" -- --data-path /nonexistent
mkdir -p "$work/empty"
expect 1 "has neither Fashion-MNIST idx files nor a train/ folder" -- --data-path "$work/empty"
expect 2 "is larger than the 64 training images" -- --limit-train 64 --batch-size 128 --limit-val 8
printf 'not a safetensors file' >"$work/bad.safetensors"
expect 1 "bad.safetensors" -- --pretrained "$work/bad.safetensors" --limit-train 64 --limit-val 8
# A CUDA backend that cannot be loaded (here: a file that is not there) is the reason the GPU
# is unavailable, named with the loader's error. (A CPU-only build says it has no CUDA.)
DPAR_CUDA_BACKEND=/nonexistent/libdpar_cuda.so.0 expect 2 "--device gpu: device cuda:0 is not available: " -- --device gpu --limit-train 64 --limit-val 8
if ! grep -qF "dpar was built without CUDA" "$work/err" &&
   ! grep -qF "the CUDA backend cannot be loaded (DPAR_CUDA_BACKEND): /nonexistent/libdpar_cuda.so.0: cannot open shared object file" "$work/err"; then
  echo "FAIL: the missing CUDA backend is not named"; fail=1
fi
exit $fail
