#!/usr/bin/env bash
# scripts/gpu-bundle.sh packs this build for the GPU machine within 64 MiB, and
# scripts/gpu-run.sh unpacks it elsewhere and runs `ctest -L gpu` from the bundle alone. Here,
# without a GPU, every GPU test must say it is skipped and the run must succeed.
# Usage: gpu_bundle.sh <source dir> <build dir> <python>
set -uo pipefail
src=$1 build=$2 python=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
if ! DPAR_GPU_BUILD_DIR=$build "$src/scripts/gpu-bundle.sh" --no-build "$work/b/dpar-gpu.tar.gz" \
  >"$work/pack" 2>&1; then
  echo "FAIL: gpu-bundle.sh"; cat "$work/pack"; exit 1
fi
cat "$work/pack"
size=$(stat -c %s "$work/b/dpar-gpu.tar.gz")
[ "$size" -le $((64 * 1024 * 1024)) ] && echo "ok: $size bytes" || { echo "FAIL: $size bytes > 64 MiB"; fail=1; }
# The bundle must carry what the binaries link that is not CUDA's or the C library's.
tar -tJf "$work/b/dpar-gpu.tar.gz" >"$work/list"
for lib in libdpar.so libdpar_cuda.so libdnnl libgloo libstdc++; do
  grep -q "dpar-gpu/lib/$lib" "$work/list" && echo "ok: packs $lib" || { echo "FAIL: no $lib in the bundle"; fail=1; }
done
# ... and the scripts the GPU machine runs from the bundle's root.
for script in gpu-run.sh gpu-probe.sh gpu-call.sh ncu-kernels.py; do
  grep -q "dpar-gpu/$script\$" "$work/list" && echo "ok: packs $script" || { echo "FAIL: no $script in the bundle"; fail=1; }
done
grep -q "dpar-gpu/lib/libcudart\|dpar-gpu/lib/libcudnn" "$work/list" &&
  { echo "FAIL: the bundle packs CUDA libraries the GPU machine has"; fail=1; }
# Run it from another folder, with the build folder out of the loader's reach.
if PYTHON=$python "$src/scripts/gpu-run.sh" "$work/b/dpar-gpu.tar.gz" "$work/run" >"$work/out" 2>&1; then
  echo "ok: gpu-run.sh exited 0"
else
  echo "FAIL: gpu-run.sh exited non-zero"; fail=1
fi
skipped=$(grep -c "\*\*\*Skipped" "$work/out")
if [ "$skipped" -ge 8 ] && grep -q "100% tests passed" "$work/out"; then
  echo "ok: $skipped GPU test cases skipped"
else
  echo "FAIL: expected every GPU test case skipped ($skipped skipped)"; fail=1
fi
# The multi-process GPU cases run from the bundle's copy of their scripts (ctest files pointed
# there), through the bundled launcher and workers.
if grep -q "gpu_mp_collectives2 .*Skipped" "$work/out" && grep -q "gpu_mp_kill9 .*Skipped" "$work/out"; then
  echo "ok: the multi-process GPU cases run from the bundle (skipped here)"
else
  echo "FAIL: the multi-process GPU cases did not run from the bundle"; grep gpu_mp "$work/out"; fail=1
fi
# A bundled test program runs on the bundle's libraries alone and says why it skips.
if LD_LIBRARY_PATH=$work/run/dpar-gpu/lib "$work/run/dpar-gpu/tests/gpu/test_cuda_train" \
  >"$work/one" 2>&1 && grep -q "dpar-gpu-test-skipped: " "$work/one"; then
  echo "ok: $(grep -m1 "dpar-gpu-test-skipped: " "$work/one")"
else
  echo "FAIL: the bundled test_cuda_train did not run or gave no reason"; cat "$work/one"; fail=1
fi
# gpu-call.sh: two probe lanes at once, then the benchmark lane; one summary, one archive. Here
# the stages fail or skip (no GPU), but each must run from the bundle: the TIPC chain once
# stopped at a script the bundle lacked.
DPAR_CALL_TESTS="tipc_gpu" DPAR_CALL_DRILLS="mp_gloo_ddp" DPAR_CALL_BENCH="bench_gpu_short kernel_times" \
  DPAR_GPU_SKIP_TESTS=1 PYTHON=$python "$src/scripts/gpu-run.sh" "$work/b/dpar-gpu.tar.gz" \
  "$work/run" -- ./gpu-call.sh "$work/call" 60 40 >"$work/call.out" 2>&1
mkdir -p "$work/call/logs"
tar -C "$work/call/logs" -xzf "$work/call/probe-logs.tar.gz" 2>/dev/null
rows=$(grep -cE '^(tipc_gpu|mp_gloo_ddp|bench_gpu_short|kernel_times) ' "$work/call/summary.txt" 2>/dev/null)
if [ "$rows" = 4 ] && [ -s "$work/call/logs/tests/tests.log" ] && [ -s "$work/call/logs/drills/drills.log" ]; then
  echo "ok: gpu-call.sh ran its three lanes"
else
  echo "FAIL: gpu-call.sh: expected a summary row per lane and their logs"; cat "$work/call.out"; fail=1
fi
if grep -rq "No such file" "$work/call/logs"; then
  echo "FAIL: a stage ran something the bundle lacks:"; grep -rh "No such file" "$work/call/logs"; fail=1
fi
# Its default test lane runs every test program the bundle holds: two programs once went
# unrun on a GPU because the lane's list was written out before they were added.
lanes=$(cd "$work/run/dpar-gpu" && ./gpu-call.sh --list)
missing=""
for t in "$work"/run/dpar-gpu/tests/gpu/test_*; do
  p=$(basename "$t")
  case $p in *.cmake) continue ;; esac
  grep -q "^tests: .* $p\( \|\$\)" <<<"$lanes" || missing="$missing $p"
done
if [ -z "$missing" ] && grep -q "^tests: .* test_cuda_conv_engines" <<<"$lanes"; then
  echo "ok: gpu-call.sh's test lane names every bundled test program"
else
  echo "FAIL: gpu-call.sh's test lane leaves out:${missing:- test_cuda_conv_engines}"; echo "$lanes"; fail=1
fi
[ "$fail" = 0 ] || cat "$work/out"
exit $fail
