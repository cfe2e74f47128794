#!/usr/bin/env bash
# The most one short call on the GPU machine can tell: a staged run of the GPU tests, drills and
# tools, each stage under its own time limit, later stages skipped when the budget runs low.
# Runs from the root of an unpacked bundle inside scripts/gpu-run.sh's environment:
#
#   DPAR_GPU_SKIP_TESTS=1 scripts/gpu-run.sh gpu-bundle/dpar-gpu.tar.gz /tmp/d -- \
#     ./gpu-probe.sh OUT_DIR [BUDGET_SECONDS]          (budget default 540 s, 9 min)
#   DPAR_PROBE_STAGES="test_cuda_ops mp_ddp" ... ./gpu-probe.sh OUT_DIR   only the named stages
#
# Without DPAR_PROBE_STAGES: the first-call stages (facts, every GPU test program, the drills,
# memcheck, the peer's imports, a short bench_gpu). These run only when named:
#   tipc_gpu               the TIPC chain of train_infer_gpu.txt (GPU 0, fp32 and fp16 AMP)
#   tipc_gpu_2rank         train_fleet_infer_gpu.txt: 2 ranks sharing GPU 0, rank-0 export, infer
#   ctest_gpu              ctest -L gpu, as CI would on a GPU machine
#   bench_gpu              bench_gpu in full (batches 128,256; fp32, fp16, bf16; inference 1, 64)
#   bench_gpu_profile      one step per precision timed op by op, and the cuDNN algorithms chosen
#   kernel_times           one training step (batch 128, fp32 and bf16) under ncu: device time
#                          per kernel, unsynchronised (ncu-kernels.py sums it by kernel)
#   bench_allreduce_gpu    bench_allreduce --device gpu (dpar vs raw ncclAllReduce vs torch)
#   bench_ddp_gpu          bench_ddp --device gpu (vs PyTorch DDP on nccl)
#   bench_ddp_cpu_w2t4     bench_ddp on the CPU, 2 ranks x 4 threads (vs DDP gloo, the ceiling)
#   bench_ddp_cpu_w4t2     the same, 4 ranks x 2 threads
#
# OUT_DIR gets at most 8 files: summary.txt (one row per stage: name, result, seconds, first
# error line), facts.txt, tests.log, cudnn.log, drills.log, sanitizer.log, bench.log.
# Results: pass, FAIL, TIMEOUT (its own limit), SKIPPED-TEST (a test said it skipped: with a
# GPU present that is a failure), budget (not run, too little time left).
# Exit status: 0 when every stage that ran passed.
set -u
out=${1:?usage: gpu-probe.sh OUT_DIR [BUDGET_SECONDS]}
budget=${2:-540}
mkdir -p "$out"
root=$(pwd)
start=$SECONDS
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
summary=$out/summary.txt
printf '%-26s %-12s %7s  %s\n' stage result seconds "first error line" >"$summary"
failed=0

launcher=$root/launch/dpar-launch
coll=$root/tests/multiproc/collectives_worker
ddp=$root/tests/multiproc/ddp_worker
drill=$root/src/tests/gpu/gpu_mp.sh
export DPAR_GPU_REQUIRED=${DPAR_GPU_REQUIRED:-1}

optional_stages=" tipc_gpu tipc_gpu_2rank ctest_gpu bench_gpu bench_gpu_profile kernel_times bench_allreduce_gpu bench_ddp_gpu bench_ddp_cpu_w2t4 bench_ddp_cpu_w4t2 "
wanted() {  # wanted NAME: named in DPAR_PROBE_STAGES, or (when unset) a first-call stage
  if [ -z "${DPAR_PROBE_STAGES:-}" ]; then
    case $optional_stages in *" $1 "*) return 1 ;; esac
    return 0
  fi
  case " $DPAR_PROBE_STAGES " in *" $1 "*) return 0 ;; esac
  return 1
}

# The PyTorch side's Python (DPAR_PEER_PYTHON, set by gpu-run.sh) with the machine's own loader
# path, as the benchmarks run their peers (bench/bench_util.h).
peer_python() {
  if [ -n "${DPAR_PEER_LD_LIBRARY_PATH+x}" ]; then
    LD_LIBRARY_PATH=$DPAR_PEER_LD_LIBRARY_PATH "${DPAR_PEER_PYTHON:-python3}" "$@"
  else
    "${DPAR_PEER_PYTHON:-python3}" "$@"
  fi
}

first_error() {  # the first line of FILE that reads like a failure
  grep -v '^=================== ' "$1" |
    grep -m1 -E 'FAILED|FAIL:|[Ee]rror|what\(\)|Segmentation|Aborted|terminate called|core dumped|not found|refused|timed out|No such file|dpar-gpu-test-skipped' |
    cut -c1-160
}

# stage NAME LIMIT LOG CMD...: runs CMD under min(LIMIT, budget left) seconds, appends its
# output to LOG and one row to the summary.
stage() {
  local name=$1 limit=$2 log=$3
  shift 3
  wanted "$name" || return 0
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 15 ]; then
    printf '%-26s %-12s %7s  %s\n' "$name" budget - "$left s of the budget left" >>"$summary"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local tmp=$scratch/stage.log t0=$SECONDS rc result
  echo "=================== $name (limit ${limit}s): $*" >"$tmp"
  # timeout(1) runs programs, not shell functions: a child bash runs the (exported) functions.
  timeout -k 5 "$limit" bash -c '"$@"' _ "$@" >>"$tmp" 2>&1
  rc=$?
  echo "=================== $name: exit $rc after $((SECONDS - t0)) s" >>"$tmp"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then result=TIMEOUT
  elif grep -q 'dpar-gpu-test-skipped' "$tmp"; then result=SKIPPED-TEST
  elif [ "$rc" = 0 ]; then result=pass
  else result=FAIL
  fi
  [ "$result" = pass ] || failed=1
  local err=""
  [ "$result" = pass ] || err=$(first_error "$tmp")
  [ "$result" != pass ] && [ -z "$err" ] && err="exit $rc"
  printf '%-26s %-12s %7s  %s\n' "$name" "$result" "$((SECONDS - t0))" "$err" >>"$summary"
  cat "$tmp" >>"$log"
}

# A Catch2 test program: all its cases in one process; if that process dies before Catch2's
# summary (a crash or the limit), each case again in its own process, so one crash does not
# hide the rest.
catch_test() {
  local program=$1
  shift
  local log=$scratch/catch.log
  "$root/tests/gpu/$program" --durations yes "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if grep -qE 'All tests passed|test cases:' "$log"; then return "$rc"; fi
  echo "--- $program died before its summary (exit $rc): each unfinished case on its own"
  # --durations prints "<seconds> s: <name>" as each case finishes.
  "$root/tests/gpu/$program" --list-test-names-only | sed '/^$/d' | while IFS= read -r name; do
    grep -qF " s: $name" "$log" && continue
    echo "--- case: $name"
    "$root/tests/gpu/$program" "$name" 2>&1 | tail -n 30
    echo "--- case exit ${PIPESTATUS[0]}"
  done
  return 1
}

facts() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_cap --format=csv
  echo "--- glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "--- cores: $(nproc); $(grep MemTotal /proc/meminfo)"
  echo "--- python: ${DPAR_PEER_PYTHON:-$(command -v python3)}"
  peer_python -c '
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "nccl", ".".join(map(str, torch.cuda.nccl.version())), "device", torch.cuda.get_device_name(0))
try:
    import onnxruntime, torchvision
    print("onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers(), "torchvision", torchvision.__version__)
except Exception as e:
    print("import failed:", e)'
  echo "--- LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "--- libraries the GPU tests resolve (not found = missing from the bundle):"
  ldd "$root/tests/gpu/test_cuda_ops" | grep -E 'not found|cud|nccl|cublas|dpar|stdc\+\+'
  local missing
  missing=$(for f in "$root"/tests/gpu/test_* "$root"/tests/multiproc/* "$root"/examples/mobilenetv3/* \
    "$root"/bench/bench_* "$root"/launch/dpar-launch; do
    [ -x "$f" ] && [ -f "$f" ] && ldd "$f" 2>/dev/null | grep 'not found' | sed "s#^#$(basename "$f"): #"
  done)
  [ -n "$missing" ] && { echo "FAIL: unresolved libraries:"; echo "$missing"; }
  echo "--- CUDA start-up (collectives_worker --gpu-check), three times:"
  local i t0
  for i in 1 2 3; do
    t0=$(date +%s%N)
    "$coll" --gpu-check
    echo "    $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  done
  [ -z "$missing" ] && [ "$("$coll" --gpu-check 2>/dev/null)" = "gpu ok" ]
}

cudnn_logged() {  # cudnn_logged NAME CMD...: CMD with cuDNN's warning/error log kept
  local name=$1
  shift
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=$scratch/cudnn_$name.log "$@"
  local rc=$?
  if [ -s "$scratch/cudnn_$name.log" ]; then
    { echo "=================== $name"; head -c 4000000 "$scratch/cudnn_$name.log"; } >>"$out/cudnn.log"
  fi
  return $rc
}

mp() { "$drill" "$1" "$launcher" "$coll" "$ddp"; }
nccl_verbose() { NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV "$@"; }

peer_imports() {
  peer_python -c '
import torch, torchvision, onnxruntime, numpy, torch.distributed as dist
x = torch.randn(8, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
m = torchvision.models.mobilenet_v3_small(num_classes=10).cuda().to(memory_format=torch.channels_last)
print("peer forward ok", m(x).shape, "nccl available", dist.is_nccl_available())'
}

export root out scratch launcher coll ddp drill
export -f catch_test facts cudnn_logged mp nccl_verbose peer_imports peer_python

stage facts 60 "$out/facts.txt" facts
stage test_cuda_errors 90 "$out/tests.log" catch_test test_cuda_errors
stage test_cuda_ops 180 "$out/tests.log" cudnn_logged ops catch_test test_cuda_ops
stage test_cuda_train 180 "$out/tests.log" cudnn_logged train catch_test test_cuda_train
stage mp_collectives2 150 "$out/drills.log" nccl_verbose mp collectives2
stage test_cuda_infer 120 "$out/tests.log" catch_test test_cuda_infer
stage test_cuda_autocast 180 "$out/tests.log" cudnn_logged autocast catch_test test_cuda_autocast
stage onnxruntime_parity 120 "$out/tests.log" "$root/src/tests/gpu/onnxruntime_parity.sh" \
  "$root/tests/gpu/test_cuda_infer"
stage mp_ddp 120 "$out/drills.log" mp ddp
stage mp_kill9 120 "$out/drills.log" mp kill9
stage mp_gloo_collectives2 120 "$out/drills.log" mp gloo_collectives2
for t in "$root"/tests/gpu/test_*; do
  case $(basename "$t") in
    *.cmake | test_cuda_errors | test_cuda_ops | test_cuda_train | test_cuda_infer | test_cuda_autocast) continue ;;
  esac
  stage "$(basename "$t")" 120 "$out/tests.log" catch_test "$(basename "$t")"
done
for c in collectives4 gloo_collectives4 ddp_no_sync ddp_unequal ddp_buckets ddp_bf16 gloo_ddp \
  timeout detail_mismatch; do
  stage "mp_$c" 120 "$out/drills.log" mp "$c"
done
memcheck() {  # compute-sanitizer's memcheck over dpar's kernels (the op tests)
  local tool
  tool=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
  [ -n "$tool" ] || { echo "FAIL: compute-sanitizer not found"; return 1; }
  "$tool" --tool memcheck --error-exitcode 1 --print-limit 50 "$root/tests/gpu/test_cuda_ops" "$@"
}
export -f memcheck
stage memcheck_ops 150 "$out/sanitizer.log" memcheck
stage peer_imports 60 "$out/bench.log" peer_imports
# Batch 128 and 10 steps: at batch 64 with 5 steps the PyTorch peer once measured twice its
# batch-128 step time.
stage bench_gpu_short 150 "$out/bench.log" "$root/bench/bench_gpu" --batches 128 --precisions fp32,bf16 \
  --infer-batches 1 --warmup 5 --steps 10 --compile false --optim false

tipc_chain() {  # tipc_chain CONFIG: the lite chain from the bundle; failing logs' tails
  local tipc=$root/src/examples/mobilenetv3/test_tipc output=$scratch/tipc_$1 rc
  DPAR_BUILD_DIR=$root DPAR_TIPC_OUTPUT=$output DPAR_TIPC_TIMEOUT=150 \
    "$tipc/test_train_inference.sh" "$tipc/configs/mobilenet_v3_small/$1.txt" lite_train_lite_infer
  rc=$?
  if [ "$rc" != 0 ]; then
    grep -rh "Run failed" "$output" 2>/dev/null | head -n 5
    for f in $(grep -rl -iE "error|fail" "$output" --include='*.log' 2>/dev/null | head -n 4); do
      echo "--- $f"; tail -n 15 "$f"
    done
  fi
  return $rc
}
export -f tipc_chain
stage tipc_gpu 150 "$out/tests.log" tipc_chain train_infer_gpu
stage tipc_gpu_2rank 150 "$out/tests.log" tipc_chain train_fleet_infer_gpu
stage ctest_gpu 300 "$out/tests.log" ctest --test-dir "$root" -L gpu --output-on-failure --timeout 280
bench="$root/bench"
stage bench_gpu_profile 150 "$out/bench.log" env DPAR_CUDNN_LOG_ALGOS=1 "$bench/bench_gpu" \
  --batches 128 --precisions fp32,fp16,bf16 --infer-batches "" --peer false --optim false \
  --warmup 3 --steps 5 --profile
# The op profile above waits for the GPU around every op, which adds each op's launch and
# synchronisation to its time; ncu times the kernels of one unsynchronised step, as it runs.
kernel_times() {
  local tool p
  tool=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
  [ -n "$tool" ] || { echo "FAIL: ncu not found"; return 1; }
  for p in fp32 bf16; do
    "$tool" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
      --csv --page raw --print-units base --log-file "$scratch/ncu_$p.csv" \
      "$root/bench/bench_gpu" --batches 128 --precisions "$p" --infer-batches "" --peer false \
      --optim false --warmup 2 --steps 2 --capture || return 1
    peer_python "$root/ncu-kernels.py" "$scratch/ncu_$p.csv" || return 1
  done
}
export -f kernel_times
stage kernel_times 150 "$out/bench.log" kernel_times
stage bench_gpu 300 "$out/bench.log" "$bench/bench_gpu" --compile false --optim false
stage bench_allreduce_gpu 100 "$out/bench.log" "$bench/bench_allreduce" --device gpu --max-mb 64 \
  --reps 3 --launcher "$launcher"
stage bench_ddp_gpu 80 "$out/bench.log" "$bench/bench_ddp" --device gpu --launcher "$launcher"
stage bench_ddp_cpu_w2t4 100 "$out/bench.log" "$bench/bench_ddp" --rounds 2 --world 2 --threads 4 \
  --launcher "$launcher"
stage bench_ddp_cpu_w4t2 100 "$out/bench.log" "$bench/bench_ddp" --rounds 2 --world 4 --threads 2 \
  --launcher "$launcher"

echo "=== probe took $((SECONDS - start)) s of a $budget s budget" >>"$summary"
cat "$summary"
exit $failed
