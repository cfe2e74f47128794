#!/usr/bin/env bash
# dpar::torch::DataParallel through the real launcher (real processes, Gloo over loopback).
#   torch_cases.sh <case> <dpar-launch> <torch_ddp_worker> <torch_shard_worker> [train_resnet18]
# Cases: plain2 plain3 no_sync unequal bf16 buckets unused_error unused_found mismatch detail
#        timeout buffers mixed checkpoint kill9 (torch_ddp_worker.cpp says what each mode
#        checks); shard_bitwise2_sgd shard_bitwise3_adamw shard_memory3 shard_clip3 shard_resume
#        shard_kill_save shard_unattached (torch_shard_worker.cpp); example (examples/libtorch
#        on 2 ranks: an epoch, then --resume for a second) and example_shard (the same with
#        --shard gradients, resumed by one process).
set -u
case_name=$1
launcher=$2
worker=$3
shard_worker=$4
example=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
# common.sh gives $work, $marker, $port, fail/ok/expect_text/expect_no_job_processes/finish.
source "$here/../launch/common.sh" "$launcher" "$worker"

launch() {  # launch <nproc> worker args... (+ the marker, except for the example)
  local n=$1
  shift
  local tail=("$marker")
  [ "$worker" = "$example" ] && tail=()  # its output folder carries the marker instead
  "$launcher" --nproc_per_node="$n" --start_port="$port" --log_dir="$work/logs" "$worker" "$@" \
    "${tail[@]}"
}

run_ok() {  # run_ok <nproc> worker args...: must exit 0
  if launch "$@" >"$work/out.txt" 2>&1; then ok "$* exited 0"; else
    fail "$* exited $?:"
    sed 's/^/    /' "$work/out.txt"
    for f in "$work"/logs/workerlog.*; do [ -f "$f" ] && { echo "  --- $f"; tail -5 "$f" | sed 's/^/    /'; }; done
  fi
}

run_fails() {  # run_fails <nproc> worker args...: must exit non-zero, without a hang
  launch "$@" >"$work/out.txt" 2>&1
  local code=$?
  [ $code -ne 0 ] && ok "$* exited $code" || fail "$* exited 0"
  cat "$work/out.txt" "$work"/logs/workerlog.* >"$work/all.txt" 2>/dev/null
}

case $case_name in
  plain2)
    run_ok 2 --mode plain --steps 4
    expect_text "$work/out.txt" "plain on 2 ranks, 4 steps: bitwise equal across ranks" ;;
  plain3)
    run_ok 3 --mode plain --steps 3
    expect_text "$work/out.txt" "plain on 3 ranks, 3 steps: bitwise equal across ranks" ;;
  no_sync)
    run_ok 2 --mode no_sync --steps 3
    expect_text "$work/out.txt" "no_sync on 2 ranks" ;;
  unequal)
    run_ok 3 --mode unequal --steps 3
    expect_text "$work/out.txt" "unequal on 3 ranks" ;;
  bf16)
    run_ok 2 --mode bf16 --steps 3
    expect_text "$work/out.txt" "bf16 on 2 ranks" ;;
  buckets)
    run_ok 2 --mode buckets --steps 3
    expect_text "$work/out.txt" "buckets rebuilt in gradient-ready order"
    expect_text "$work/out.txt" "buckets on 2 ranks" ;;
  unused_error)
    run_fails 2 --mode unused --steps 2
    expect_text "$work/all.txt" "received no gradient in this backward pass: unused.weight, unused.bias"
    expect_text "$work/all.txt" "find_unused_parameters"
    expect_no_job_processes ;;
  unused_found)
    run_ok 2 --mode unused --find-unused --steps 3
    expect_text "$work/out.txt" "unused on 2 ranks" ;;
  mismatch)
    run_fails 2 --mode mismatch
    expect_text "$work/all.txt" "DataParallel: parameter 0 differs across ranks: rank 0 has conv1.weight Float[8,3,3,3], rank 1 has conv1.weight Float[9,3,3,3]"
    expect_no_job_processes ;;
  detail)
    DPAR_DEBUG=DETAIL DPAR_TIMEOUT=20 run_fails 2 --mode detail
    expect_text "$work/all.txt" "mismatch"
    expect_text "$work/all.txt" "[1000]"
    expect_text "$work/all.txt" "[999]"
    expect_no_job_processes ;;
  timeout)
    # Over TCP (DPAR_SHM=0) the skipped all-reduce times out (3 s); through shared memory the
    # ranks see at once that one all-reduces while the other waits at the barrier after it, so
    # that drill gets 60 s, past the 30 s limit: a short timeout could fire first on a loaded
    # machine, where one rank may reach the segment seconds after the other.
    for shm in 0 1; do
      start=$(now_ms)
      collective_timeout=3
      [ $shm = 1 ] && collective_timeout=60
      DPAR_SHM=$shm DPAR_TIMEOUT=$collective_timeout run_fails 2 --mode timeout
      elapsed=$(($(now_ms) - start))
      [ $elapsed -lt 30000 ] && ok "DPAR_SHM=$shm: failed after $elapsed ms" ||
        fail "DPAR_SHM=$shm: took $elapsed ms (limit 30 s)"
      expect_text "$work/all.txt" "allreduce"
      if [ $shm = 0 ]; then
        expect_text "$work/all.txt" "timed out"
      else
        expect_text "$work/all.txt" "the ranks called different collectives"
      fi
      expect_no_job_processes
    done ;;
  buffers)
    run_ok 2 --mode buffers --steps 2
    expect_text "$work/out.txt" "buffers: running statistics bitwise equal (rank 0's) across ranks"
    run_ok 2 --mode buffers --steps 2 --no-broadcast-buffers
    expect_text "$work/out.txt" "buffers: running statistics each rank's own across ranks" ;;
  mixed)
    run_ok 2 --mode mixed --steps 3
    expect_text "$work/out.txt" "mixed: both bitwise equal across ranks" ;;
  checkpoint)
    run_ok 2 --mode checkpoint --steps 5 --save-at 2 --dir "$work"
    expect_text "$work/out.txt" "checkpoint: resumed at step 2, bitwise equal" ;;
  kill9)
    launch 2 --mode plain --steps 100000 --die-rank 1 --die-step 3 >"$work/out.txt" 2>&1
    code=$?
    expect_kill9_teardown $code "$(now_ms)" "$work/out.txt" "$work"/logs/workerlog.* ;;
  shard_bitwise[23]_*)
    # shard = optimizer and gradients bitwise equal to none (uneven slices at 3 ranks)
    n=${case_name:13:1}
    opt=${case_name##*_}
    worker=$shard_worker
    run_ok "$n" --check bitwise --opt "$opt"
    expect_text "$work/out.txt" "$n ranks, $opt, 20 steps" ;;
  shard_memory3)
    worker=$shard_worker
    run_ok 3 --check memory
    expect_text "$work/out.txt" "shard gradients per rank" ;;
  shard_clip3)
    worker=$shard_worker
    run_ok 3 --check clip
    expect_text "$work/out.txt" "clip_grad_norm on 3 ranks" ;;
  shard_resume)
    # Save a sharded AdamW state on 2 ranks; resume on 3 and on 1, sharded or not.
    worker=$shard_worker
    run_ok 2 --check save --dir "$work"
    for n in 3 1; do
      run_ok "$n" --check resume --dir "$work" --steps 10
      expect_text "$work/out.txt" "resumed on $n ranks"
    done ;;
  shard_kill_save)
    # kill -9 of a rank while shard sets are written: a set is never partial (the one being
    # written stays .tmp), the earlier one still loads (on another number of ranks).
    worker=$shard_worker
    launch 2 --check kill-save --dir "$work" >"$work/out.txt" 2>&1
    code=$?
    [ $code -ne 0 ] && ok "the job failed ($code)" || fail "the job survived a dead rank"
    expect_text "$work/logs/workerlog.1" "killing myself with SIGKILL"
    expect_no_partial_sets "$work" 2
    [ -f "$work/set_a/index.json" ] && ok "set_a intact" || fail "set_a lost its index"
    run_ok 3 --check load --dir "$work"
    expect_text "$work/out.txt" "AdamW state of step 3" ;;
  shard_unattached)
    worker=$shard_worker
    run_fails 2 --check unattached
    expect_text "$work/all.txt" "no optimizer was made by ddp.make_optimizer<Opt>(options)"
    expect_no_job_processes ;;
  example)
    # A small slice of Fashion-MNIST: one epoch, then a resumed run for the second.
    out=$work/$marker
    flags=(--limit 256 --batch_size 32 --log_interval 4 --output_dir "$out")
    worker=$example
    run_ok 2 --epochs 1 "${flags[@]}"
    expect_text "$work/out.txt" "[Epoch 0, iter: 4] top1:"
    expect_text "$work/out.txt" "[Eval][Epoch 0][Avg] loss:"
    expect_text "$work/out.txt" "after fusion: 3 buckets"
    [ -s "$out/resnet18.ckpt" ] && [ -s "$out/resnet18.pt" ] && ok "rank 0 saved" ||
      fail "no resnet18.ckpt / resnet18.pt in $out"
    run_ok 2 --epochs 2 --resume "${flags[@]}"
    expect_text "$work/out.txt" "resumed from $out/resnet18.ckpt at epoch 1"
    expect_text "$work/out.txt" "[Eval][Epoch 1][Avg] loss:" ;;
  example_shard)
    # --shard gradients on 2 ranks for an epoch; the optimizer state goes to a shard set the
    # checkpoint names, which one process then resumes from for the second epoch.
    out=$work/$marker
    flags=(--limit 256 --batch_size 32 --log_interval 4 --output_dir "$out")
    worker=$example
    run_ok 2 --epochs 1 --shard gradients "${flags[@]}"
    expect_text "$work/out.txt" "[Eval][Epoch 0][Avg] loss:"
    [ -f "$out/resnet18.optimizer_epoch1/index.json" ] && ok "the shard set was written" ||
      fail "no $out/resnet18.optimizer_epoch1/index.json"
    run_ok 1 --epochs 2 --resume "${flags[@]}"
    expect_text "$work/out.txt" "resumed from $out/resnet18.ckpt at epoch 1"
    expect_text "$work/out.txt" "[Eval][Epoch 1][Avg] loss:" ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
finish
