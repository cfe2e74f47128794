#!/usr/bin/env bash
# Multi-process tests through the real launcher (real processes, real Gloo over loopback).
#   mp_cases.sh <case> <dpar-launch> <collectives_worker> <ddp_worker> <shard_worker>
# Cases: collectives2 collectives4 ddp ddp_no_sync ddp_unequal ddp_buckets ddp_bf16 two_nodes
#        kill9 timeout detail_mismatch recorder_skip recorder_shape recorder_stop
#        shard_bitwise{2,3}_{sgd,adamw} shard_memory{2,3}
#        shard_clip3 shard_resume shard_kill_save
set -u
case_name=$1
launcher=$2
coll=$3
ddp=$4
shard=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
# common.sh gives $work, $marker, $port, fail/ok/expect_text/expect_no_job_processes/finish.
source "$here/../launch/common.sh" "$launcher" "$coll"

launch() {  # launch <log subdir> <nproc> [launcher flags...] -- program args...
  local logs=$work/$1 n=$2
  shift 2
  "$launcher" --nproc_per_node="$n" --start_port="$port" --log_dir="$logs" "$@"
}

run_ok() {  # run_ok <what> <command...>: must exit 0
  local what=$1
  shift
  if "$@" >"$work/out.txt" 2>&1; then ok "$what exited 0"; else
    fail "$what exited $?:"
    sed 's/^/    /' "$work/out.txt"
    for f in "$work"/*/workerlog.*; do [ -f "$f" ] && { echo "  --- $f"; tail -5 "$f" | sed 's/^/    /'; }; done
  fi
}

case $case_name in
  collectives2)
    run_ok "2-rank collectives" launch logs 2 "$coll" "$marker"
    expect_text "$work/out.txt" "rank 0/2:" ;;
  collectives4)
    run_ok "4-rank collectives" launch logs 4 "$coll" "$marker"
    expect_text "$work/out.txt" "rank 0/4:"
    for i in 1 2 3; do expect_text "$work/logs/workerlog.$i" "/4: "; done ;;
  ddp)
    run_ok "2-rank DataParallel" launch logs 2 "$ddp" --steps 3 "$marker"
    expect_text "$work/out.txt" "bitwise equal across ranks" ;;
  ddp_no_sync)
    run_ok "no_sync accumulation" launch logs 2 "$ddp" --steps 3 --no-sync "$marker"
    expect_text "$work/out.txt" "no_sync accumulation" ;;
  ddp_unequal)
    run_ok "unequal local batches" launch logs 3 "$ddp" --steps 3 --unequal "$marker"
    expect_text "$work/out.txt" "unequal local batches" ;;
  ddp_buckets)
    # tiny buckets: many all-reduces overlapping backward, rebuilt after the first step
    run_ok "many small buckets" launch logs 2 "$ddp" --steps 3 --bucket-mb 0.002 "$marker"
    expect_text "$work/out.txt" "after fusion" ;;
  ddp_bf16)
    # compressed gradients (comm_dtype bf16) on 4 ranks, several buckets
    run_ok "bf16 gradients" launch logs 4 "$ddp" --steps 3 --bf16 --bucket-mb 0.002 "$marker"
    expect_text "$work/out.txt" "bf16 gradients: bitwise equal across ranks" ;;
  two_nodes)
    # Two launchers = two nodes on loopback, 2 processes each (world size 4).
    "$launcher" --ips=127.0.0.1,127.0.0.2 --host=127.0.0.1 --nproc_per_node=2 --start_port="$port" \
      --log_dir="$work/node0" "$ddp" --steps 3 "$marker" >"$work/node0.txt" 2>&1 &
    a=$!
    "$launcher" --ips=127.0.0.1,127.0.0.2 --host=127.0.0.2 --nproc_per_node=2 --start_port="$port" \
      --log_dir="$work/node1" "$ddp" --steps 3 "$marker" >"$work/node1.txt" 2>&1 &
    b=$!
    wait $a; ra=$?
    wait $b; rb=$?
    [ $ra -eq 0 ] && [ $rb -eq 0 ] && ok "both nodes exited 0" || {
      fail "node exits $ra/$rb"; cat "$work/node0.txt" "$work/node1.txt"; }
    expect_text "$work/node0.txt" "ddp_worker: 4 ranks" ;;
  kill9)
    launch logs 2 "$ddp" --steps 100000 --die-rank 1 --die-step 3 "$marker" >"$work/out.txt" 2>&1
    code=$?
    expect_kill9_teardown $code "$(now_ms)" "$work/out.txt" "$work"/logs/workerlog.* ;;
  timeout)
    # rank 1 skips an all-reduce (and goes on to a barrier): rank 0 must fail naming the op, not
    # hang. Over TCP (DPAR_SHM=0) that is the collective timeout; through shared memory the
    # ranks see at once that they called different collectives, and both say so.
    # DPAR_DRILL_TIMEOUT (default 3 s) is the collective timeout of the TCP drill: ranks sharing
    # one GPU need longer to set up before the skipped all-reduce. The shared-memory drill gets
    # 60 s, well past its limit: it must not wait for any timeout, and a short one could fire
    # first on a loaded machine, where one rank may reach the segment seconds after the other.
    drill_timeout=${DPAR_DRILL_TIMEOUT:-3}
    limit_ms=$(( (drill_timeout + 27) * 1000 ))
    shm_runs="0 1"
    [ "${DPAR_DIST_BACKEND:-}" = nccl ] && shm_runs=0  # the NCCL group (gpu_mp.sh): its timeout
    for shm in $shm_runs; do
      start=$(now_ms)
      collective_timeout=$drill_timeout
      [ $shm = 1 ] && collective_timeout=60
      DPAR_SHM=$shm DPAR_TIMEOUT=$collective_timeout launch logs$shm 2 "$ddp" --skip-rank 1 \
        "$marker" >"$work/out.txt" 2>&1
      code=$?
      elapsed=$(( $(now_ms) - start ))
      [ $code -ne 0 ] && ok "DPAR_SHM=$shm: launcher exited $code" ||
        fail "DPAR_SHM=$shm: a skipped collective went unnoticed"
      [ $elapsed -lt $limit_ms ] && ok "DPAR_SHM=$shm: failed after $elapsed ms" ||
        fail "DPAR_SHM=$shm: took $elapsed ms (limit $limit_ms ms)"
      cat "$work"/logs$shm/workerlog.* >"$work/all.txt"
      expect_text "$work/all.txt" "allreduce"
      if [ $shm = 0 ]; then
        expect_text "$work/all.txt" "timed out"
      else
        expect_text "$work/all.txt" "rank 1 waits at a barrier, rank 0 all-reduces 1000 elements"
        expect_text "$work/all.txt" "the ranks called different collectives"
      fi
      expect_no_job_processes
    done ;;
  recorder_skip | recorder_shape)
    # A drill's flight records (rank 1 skips the all-reduce, or all-reduces 999 elements for
    # 1000): dpar-launch names the position and both calls.
    drill=--skip-rank; other="barrier()"
    [ "$case_name" = recorder_shape ] && { drill=--mismatch-rank; other="allreduce(f32[999])"; }
    DPAR_TIMEOUT=${DPAR_DRILL_TIMEOUT:-3} launch logs 2 "$ddp" $drill 1 "$marker" >"$work/out.txt" 2>&1
    code=$?
    [ $code -ne 0 ] && ok "launcher exited $code" || fail "the drill went unnoticed"
    expect_text "$work/out.txt" \
      "flight recorder: ranks disagree at #2 of gloo/1: rank 0 called allreduce(f32[1000]); rank 1 called $other"
    expect_text "$work/out.txt" "flight records: $work/logs/flight_recorder"
    [ -f "$work/logs/flight_recorder/rank0.json" ] && ok "rank 0 left its record" ||
      fail "no $work/logs/flight_recorder/rank0.json"
    expect_no_job_processes ;;
  recorder_stop)
    # rank 1 stops (SIGSTOP) in its third step: rank 0 warns of the stall after 2 s, times out
    # after 6, and the verdict names the collective it waits in and the stopped rank, which
    # the teardown still ends.
    start=$(now_ms)
    DPAR_TIMEOUT=6 DPAR_STALL_WARNING=2 launch logs 2 "$ddp" --stop-rank 1 --die-step 2 \
      "$marker" >"$work/out.txt" 2>&1
    code=$?
    elapsed=$(( $(now_ms) - start ))
    [ $code -ne 0 ] && ok "launcher exited $code" || fail "a stopped rank went unnoticed"
    [ $elapsed -lt 30000 ] && ok "ended after $elapsed ms" || fail "took $elapsed ms (limit 30 s)"
    expect_text "$work/logs/workerlog.0" "stall: rank 0 (group gloo/1) has waited "
    expect_text "$work/logs/workerlog.0" \
      " s in allreduce(f32[853]) #7 (DataParallel bucket 0); ranks that have not arrived: 1"
    expect_text "$work/out.txt" "flight recorder: rank 0 waits in allreduce("
    expect_text "$work/out.txt" "flight recorder: rank 1 left no flight record (stopped (SIGSTOP"
    expect_no_job_processes ;;
  detail_mismatch)
    DPAR_DEBUG=DETAIL DPAR_TIMEOUT=20 launch logs 2 "$ddp" --mismatch-rank 1 "$marker" >"$work/out.txt" 2>&1
    code=$?
    [ $code -ne 0 ] && ok "launcher exited $code" || fail "a shape mismatch went unnoticed"
    cat "$work"/logs/workerlog.* >"$work/all.txt"
    expect_text "$work/all.txt" "mismatch"
    expect_text "$work/all.txt" "[1000]"
    expect_text "$work/all.txt" "[999]" ;;
  shard_bitwise[23]_*)
    # 20 steps of MobileNetV3-small: shard optimizer and gradients bitwise equal to none
    n=${case_name:13:1}
    opt=${case_name##*_}
    run_ok "$n-rank sharded $opt" launch logs "$n" "$shard" --check bitwise --opt "$opt" "$marker"
    expect_text "$work/out.txt" "$n ranks, $opt, 20 steps" ;;
  shard_memory[23])
    n=${case_name:12:1}
    run_ok "$n-rank sharded memory" launch logs "$n" "$shard" --check memory --opt adamw \
      --steps 3 "$marker"
    expect_text "$work/out.txt" "shard gradients per rank" ;;
  shard_resume)
    # Save on 2 ranks (sharded), resume on 3 and on 1: every way of loading the optimizer
    # state gives the unsharded resume's next 10 steps bitwise.
    run_ok "2-rank sharded save" launch save 2 "$shard" --check save --dir "$work/ckpt" "$marker"
    for n in 3 1; do
      run_ok "$n-rank resume" launch resume$n "$n" "$shard" --check resume --dir "$work/ckpt" \
        --steps 10 "$marker"
      expect_text "$work/out.txt" "resumed on $n ranks"
    done ;;
  shard_kill_save)
    # kill -9 of a rank while shard sets are written: a set is never partial (the one being
    # written stays .tmp), the earlier one still loads (on another number of ranks).
    launch kill 2 "$shard" --check kill-save --dir "$work/ckpt" "$marker" >"$work/out.txt" 2>&1
    code=$?
    [ $code -ne 0 ] && ok "the job failed ($code)" || fail "the job survived a dead rank"
    expect_text "$work/kill/workerlog.1" "killing myself with SIGKILL"
    expect_no_partial_sets "$work/ckpt" 2
    [ -f "$work/ckpt/set_a/index.json" ] && ok "set_a intact" || fail "set_a lost its index"
    run_ok "3-rank load of set_a" launch load 3 "$shard" --check load --dir "$work/ckpt" \
      --shards "$work/ckpt/set_a" "$marker"
    expect_text "$work/out.txt" "AdamW state of step 3" ;;
  shard_clip3)
    run_ok "3-rank clip_grad_norm" launch logs 3 "$shard" --check clip "$marker"
    expect_text "$work/out.txt" "clip_grad_norm" ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
finish
