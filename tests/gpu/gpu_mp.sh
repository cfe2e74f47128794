#!/usr/bin/env bash
# Multi-process GPU tests: the tests/multiproc drills (real dpar-launch, real processes) with
# every rank's tensors on GPU 0 of the one-GPU machine.
#   gpu_mp.sh <case> <dpar-launch> <collectives_worker> <ddp_worker>
# <case> is an mp_cases.sh case on the NCCL group, or gloo_<case> on the Gloo group through
# host memory (DPAR_DIST_BACKEND=gloo). NCCL refuses two ranks on one device of one host, so
# each rank takes its own NCCL_HOSTID (DPAR_TEST_NCCL_HOST_PER_RANK, see
# tests/multiproc/worker_device.h) and the ranks talk over NCCL's socket transport on lo.
# Without a usable GPU it prints the reason with the marker ctest reports as skipped, or fails
# where a GPU must be there (DPAR_GPU_REQUIRED=1, set by scripts/gpu-run.sh on a GPU machine).
set -u
case_name=$1
launcher=$2
coll=$3
ddp=$4
here=$(cd "$(dirname "$0")" && pwd)

# stdout only: a driver or loader warning on stderr must not turn a usable GPU into a skip
# (it is shown when there is no GPU).
check_err=$(mktemp)
state=$("$coll" --gpu-check 2>"$check_err")
check_rc=$?
check_stderr=$(cat "$check_err")
rm -f "$check_err"
if [ "$state" != "gpu ok" ]; then
  [ -n "$check_stderr" ] && sed 's/^/  gpu-check stderr: /' <<<"$check_stderr"
  [ -n "$state" ] || state="collectives_worker --gpu-check printed nothing (exit $check_rc)"
  if [ "${DPAR_GPU_REQUIRED:-0}" = 1 ]; then
    echo "FAIL: DPAR_GPU_REQUIRED=1 but $state"
    exit 1
  fi
  echo "dpar-gpu-test-skipped: $state"
  exit 0
fi
export DPAR_TEST_DEVICE=gpu:0 DPAR_TEST_NCCL_HOST_PER_RANK=1
# Ranks time-slicing one GPU are slow: a stuck collective is named by dpar's own timeout well
# before ctest's (300 s) kills the case; the timeout drill gets a longer collective timeout too.
export DPAR_TIMEOUT=${DPAR_TIMEOUT:-120} DPAR_DRILL_TIMEOUT=${DPAR_DRILL_TIMEOUT:-30}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
  NCCL_IB_DISABLE=1
case $case_name in
  gloo_*)
    export DPAR_DIST_BACKEND=gloo
    case_name=${case_name#gloo_} ;;
  *) export DPAR_DIST_BACKEND=nccl ;;
esac

gpu_apps() {  # processes holding GPU memory, one pid per line (none without nvidia-smi)
  command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid --format=csv,noheader
}
# Every process of this job carries the tag, so that processes of other tests sharing the GPU
# (ctest -j) are not taken for ones this job left behind.
export DPAR_DRILL_JOB_TAG="gpu_mp_${case_name}_$$"
job_gpu_apps() {  # GPU-holding processes of this job: tagged, or new and not visible in /proc
  local pid
  for pid in $(gpu_apps); do
    if [ -r "/proc/$pid/environ" ]; then
      tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "DPAR_DRILL_JOB_TAG=$DPAR_DRILL_JOB_TAG" &&
        echo "$pid"
    elif ! grep -qxF "$pid" <<<"$before"; then
      echo "$pid"  # another pid namespace: judged by whether it is new
    fi
  done
}
before=$(gpu_apps | sort)
"$here/../multiproc/mp_cases.sh" "$case_name" "$launcher" "$coll" "$ddp"
rc=$?
if [ "$case_name" = kill9 ] && command -v nvidia-smi >/dev/null; then
  sleep 1
  left=$(job_gpu_apps)
  if [ -z "$left" ]; then
    echo "ok: no process of the job holds GPU memory"
  else
    echo "FAIL: processes of the job holding GPU memory after the teardown: $(echo $left)"
    rc=1
  fi
fi
exit $rc
