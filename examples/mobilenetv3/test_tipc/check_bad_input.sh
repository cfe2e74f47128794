#!/usr/bin/env bash
# Bad input to the test chain: a params file with an unknown key (a fixed key and a --flag the
# program lacks), a bad mode, a missing data folder (for the chain and for prepare.sh) and a
# data folder with an empty class folder. Each must give one clear error line naming the
# culprit and a non-zero exit, without crashing and without overwriting earlier results.
#   check_bad_input.sh      (DPAR_BUILD_DIR: the build, default <repo>/build)
set -u
here=$(cd "$(dirname "$0")" && pwd)
config=$here/configs/mobilenet_v3_small/train_infer.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export DPAR_TIPC_OUTPUT=$work/output
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }

# The output of an earlier good run, which no rejected run may touch.
sentinel_dir=$DPAR_TIPC_OUTPUT/mobilenet_v3_small/lite_train_lite_infer
mkdir -p "$sentinel_dir"
echo "earlier results" >"$sentinel_dir/results.log"

# expect_error NAME PATTERN COMMAND...: exit status 1, exactly one stderr line, matching PATTERN
# (an extended regex), no crash, and the earlier results.log intact.
expect_error() {
  local name=$1 pattern=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local rc=$? lines
  lines=$(wc -l <"$work/err")
  if [ $rc -ne 1 ]; then
    fail "$name: exit status $rc, expected 1; stderr: $(cat "$work/err")"
  elif [ "$lines" -ne 1 ]; then
    fail "$name: $lines stderr lines, expected one:"
    sed 's/^/    /' "$work/err"
  elif ! grep -qE -- "$pattern" "$work/err"; then
    fail "$name: the error does not match /$pattern/: $(cat "$work/err")"
  else
    ok "$name: $(cat "$work/err")"
  fi
  if [ "$(cat "$sentinel_dir/results.log")" != "earlier results" ]; then
    fail "$name: results.log of the earlier run was overwritten"
    echo "earlier results" >"$sentinel_dir/results.log"
  fi
}

"$here/prepare.sh" "$config" lite_train_lite_infer >"$work/prepare.out" 2>&1 ||
  { cat "$work/prepare.out"; echo "FAIL: prepare.sh failed"; exit 1; }

# An unknown fixed key, reported with its line number, by both scripts.
sed '3a gpu_lst:cpu:2' "$config" >"$work/unknown_key.txt"
for script in test_train_inference.sh prepare.sh; do
  expect_error "$script, unknown key" "unknown_key.txt:4: unknown key 'gpu_lst' in train_params" \
    "$here/$script" "$work/unknown_key.txt" lite_train_lite_infer
done
# A --flag key the program does not have.
sed 's/^--warmup:1$/--warm-up:1/' "$config" >"$work/unknown_flag.txt"
line=$(grep -n '^--warm-up:' "$work/unknown_flag.txt" | cut -d: -f1)
expect_error "unknown --flag key" \
  "unknown_flag.txt:$line: unknown key '--warm-up' in infer_params: infer has no such flag" \
  "$here/test_train_inference.sh" "$work/unknown_flag.txt" lite_train_lite_infer
# An unknown section header and a line that is not key:value.
sed 's/=train_params=/=training_params=/' "$config" >"$work/bad_section.txt"
expect_error "unknown section" "bad_section.txt:1: unknown section 'training_params'" \
  "$here/test_train_inference.sh" "$work/bad_section.txt" lite_train_lite_infer
# A mode selection without the mode being run, and a run mode that does not exist.
sed 's/^--img-size:32$/--img-size:whole_train_whole_infer=32/' "$config" >"$work/no_mode.txt"
expect_error "value without the mode" "img-size has no value for mode lite_train_lite_infer" \
  "$here/test_train_inference.sh" "$work/no_mode.txt" lite_train_lite_infer
expect_error "unknown mode" "mode 'lite_infer' is not one of" \
  "$here/test_train_inference.sh" "$config" lite_infer
# A malformed gpu_list.
sed 's/^gpu_list:.*/gpu_list:cpu:two/' "$config" >"$work/bad_gpus.txt"
expect_error "bad gpu_list" "gpu_list entry 'cpu:two'" \
  "$here/test_train_inference.sh" "$work/bad_gpus.txt" lite_train_lite_infer

# A missing data folder: the chain names it before running anything; so does prepare.sh for a
# missing Fashion-MNIST.
sed "s#^--data-path:.*#--data-path:$work/no_such_data#" "$config" >"$work/no_data.txt"
expect_error "missing data folder" "--data-path $work/no_such_data: no such folder.*prepare.sh" \
  "$here/test_train_inference.sh" "$work/no_data.txt" lite_train_lite_infer
expect_error "prepare.sh, missing Fashion-MNIST" "Fashion-MNIST not found: $work/no_fmnist/" \
  env DPAR_FASHION_MNIST="$work/no_fmnist" "$here/prepare.sh" "$config" lite_train_lite_infer

# An empty class folder: training stops with the data loader's error naming the folder; the
# chain records the failed command and exits 1.
cp -r "$here/data/lite" "$work/empty_class"
mkdir "$work/empty_class/train/Zebra" "$work/empty_class/val/Zebra"
sed -e "s#^--data-path:.*#--data-path:$work/empty_class#" \
  -e 's/^reproducibility_check:.*/reproducibility_check:False/' "$config" >"$work/empty_class.txt"
rm -rf "$DPAR_TIPC_OUTPUT/mobilenet_v3_small"
"$here/test_train_inference.sh" "$work/empty_class.txt" lite_train_lite_infer >"$work/out" 2>"$work/err"
rc=$?
results=$DPAR_TIPC_OUTPUT/mobilenet_v3_small/lite_train_lite_infer/results.log
if [ $rc -ne 1 ]; then
  fail "empty class folder: exit status $rc, expected 1"
  cat "$work/out" "$work/err"
elif ! grep -q "^Run failed with command - .*dpar-launch.*train .*!$" "$results"; then
  fail "empty class folder: results.log has no failed training command:"
  cat "$results"
elif ! grep -qF "$work/empty_class/train/Zebra" "$work/err"; then
  fail "empty class folder: the chain's stderr does not name the empty folder:"
  cat "$work/err"
elif grep -qE "terminate called|Segmentation|core dumped|Aborted" "$work/out" "$work/err" \
  "$DPAR_TIPC_OUTPUT"/mobilenet_v3_small/lite_train_lite_infer/train_*/log/workerlog.*; then
  fail "empty class folder: a program crashed"
else
  ok "empty class folder: training failed with: $(grep -m1 -F "$work/empty_class/train/Zebra" "$work/err")"
fi

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
