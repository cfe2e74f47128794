#!/usr/bin/env bash
# One device call, as much as it can hold: gpu-probe.sh in two lanes at once (the single-process
# GPU tests in one, the multi-process drills in the other: one GPU and 16 cores hold both), then
# the benchmarks alone so that their timings share the machine with nothing. Every log goes into
# one archive, so that the call's few returned files hold all of it.
# From the root of an unpacked bundle, inside scripts/gpu-run.sh's environment:
#
#   DPAR_GPU_SKIP_TESTS=1 scripts/gpu-run.sh gpu-bundle/dpar-gpu.tar.gz /tmp/d -- \
#     ./gpu-call.sh OUT_DIR [LANES_SECONDS] [BENCH_SECONDS]      (defaults 270 and 240)
#   DPAR_CALL_TESTS="test_cuda_ops" DPAR_CALL_DRILLS="mp_ddp" DPAR_CALL_BENCH="" ...
#                                          other stage lists (gpu-probe.sh's stage names)
#   ./gpu-call.sh --list                   the stages each lane would run, and nothing else
#
# OUT_DIR gets summary.txt (the three lanes' tables) and probe-logs.tar.gz (each lane's files).
# Exit status: 0 when every stage that ran passed.
set -u
out=${1:?usage: gpu-call.sh OUT_DIR [LANES_SECONDS] [BENCH_SECONDS]}
lanes_budget=${2:-270}
bench_budget=${3:-240}
# The test programs first in this order (what the later ones need is tested by the earlier),
# then every other program the bundle holds, found there: a list written out alone once missed
# the two programs added after it. The probe names a program's stage after it.
programs="test_cuda_errors test_cuda_ops test_cuda_train test_cuda_infer test_cuda_autocast \
test_cuda_half_ops"
for p in $(cd tests/gpu 2>/dev/null && ls test_* 2>/dev/null | grep -v '\.cmake$'); do
  case " $programs " in *" $p "*) ;; *) programs="$programs $p" ;; esac
done
tests=${DPAR_CALL_TESTS-facts $programs onnxruntime_parity memcheck_ops tipc_gpu}
drills=${DPAR_CALL_DRILLS-mp_collectives2 mp_gloo_collectives2 mp_ddp mp_kill9 mp_collectives4 \
mp_gloo_collectives4 mp_ddp_no_sync mp_ddp_unequal mp_ddp_buckets mp_ddp_bf16 mp_gloo_ddp \
mp_timeout mp_detail_mismatch tipc_gpu_2rank}
# With each kernel's device time in one step: where the time goes is what the next change
# needs.
bench=${DPAR_CALL_BENCH-peer_imports kernel_times bench_gpu_short}

if [ "$out" = --list ]; then  # the stages each lane would run, one lane a line
  printf 'tests: %s\ndrills: %s\nbench: %s\n' "$tests" "$drills" "$bench"
  exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

status=0
lane() {  # lane NAME BUDGET STAGES: one probe run on the named stages (none named: nothing)
  [ -n "$3" ] || return 0
  DPAR_PROBE_STAGES=$3 ./gpu-probe.sh "$work/$1" "$2" >"$work/$1.stdout" 2>&1
}
lane tests "$lanes_budget" "$tests" &
tests_pid=$!
lane drills "$lanes_budget" "$drills" &
drills_pid=$!
wait "$tests_pid" || status=1
wait "$drills_pid" || status=1
lane bench "$bench_budget" "$bench" || status=1

for l in tests drills bench; do
  [ -f "$work/$l/summary.txt" ] || continue
  echo "##### $l"
  cat "$work/$l/summary.txt"
done | tee "$out/summary.txt"
tar -C "$work" -czf "$out/probe-logs.tar.gz" .
exit $status
