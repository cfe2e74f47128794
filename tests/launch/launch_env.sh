#!/usr/bin/env bash
# The environment each process gets (dpar, PaddlePaddle and torchrun names), one log file per
# process, rank 0 echoed on the console, and the GPU variables.
set -u
source "$(dirname "$0")/common.sh" "$@"

echo "== 1 node x 3 CPU processes"
unset OMP_NUM_THREADS CUDA_VISIBLE_DEVICES FLAGS_selected_gpus
"$launcher" --nproc_per_node=3 --run_mode=collective --log_dir="$work/log" --start_port=$port \
  "$worker" lines=3 "$marker" >"$work/out" 2>"$work/err"
rc=$?
[ $rc -eq 0 ] && ok "exit 0" || { fail "exit $rc"; cat "$work/err"; }
master=127.0.0.1:$((port + 3))
endpoints=127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))
omp=$(($(nproc) / 3)); [ $omp -lt 1 ] && omp=1
for i in 0 1 2; do
  log=$work/log/workerlog.$i
  [ -f "$log" ] || { fail "no $log"; continue; }
  for kv in DPAR_RANK=$i DPAR_WORLD_SIZE=3 DPAR_LOCAL_RANK=$i DPAR_LOCAL_SIZE=3 \
      DPAR_NODE_RANK=0 DPAR_NNODES=1 DPAR_MASTER=$master DPAR_ENDPOINTS=$endpoints \
      DPAR_CURRENT_ENDPOINT=127.0.0.1:$((port + i)) DPAR_JOB_ID=dpar-127.0.0.1-$((port + 3)) \
      DPAR_DEVICE=cpu DPAR_RESTART_COUNT=0 \
      PADDLE_TRAINER_ID=$i PADDLE_TRAINERS_NUM=3 PADDLE_TRAINER_ENDPOINTS=$endpoints \
      PADDLE_CURRENT_ENDPOINT=127.0.0.1:$((port + i)) PADDLE_RANK_IN_NODE=$i \
      RANK=$i WORLD_SIZE=3 LOCAL_RANK=$i LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$((port + 3)) OMP_NUM_THREADS=$omp "line 3 of rank $i" "rank $i done"; do
    expect_line "$log" "$kv"
  done
  expect_no_text "$log" "FLAGS_selected_gpus="
  expect_no_text "$log" "CUDA_VISIBLE_DEVICES="
done
# The console: the table, then rank 0's output only.
expect_text "$work/out" "Distributed environment of local rank 0"
expect_text "$work/out" "| DPAR_ENDPOINTS"
expect_line "$work/out" "line 3 of rank 0"
expect_line "$work/out" "DPAR_RANK=0"
expect_no_text "$work/out" "of rank 1"
expect_no_text "$work/out" "of rank 2"

echo "== OMP_NUM_THREADS is kept when set; --log-dir spelling; --devices alias and GPU variables"
# CUDA_VISIBLE_DEVICES declares GPUs 0 and 1, so the launcher does not ask this (GPU-less)
# machine for its devices.
CUDA_VISIBLE_DEVICES=0,1 OMP_NUM_THREADS=7 "$launcher" --devices=0,1 --log-dir="$work/gpu" --start_port=$port \
  "$worker" "$marker" >"$work/out" 2>"$work/err" || { fail "gpu run failed"; cat "$work/err"; }
for i in 0 1; do
  log=$work/gpu/workerlog.$i
  for kv in OMP_NUM_THREADS=7 CUDA_VISIBLE_DEVICES=0,1 FLAGS_selected_gpus=$i DPAR_DEVICE=gpu:$i \
      DPAR_WORLD_SIZE=2; do
    expect_line "$log" "$kv"
  done
done

echo "== --gpus picks from an inherited CUDA_VISIBLE_DEVICES"
CUDA_VISIBLE_DEVICES=4,5,6 "$launcher" --gpus=6,4 --log_dir="$work/cvd" --start_port=$port \
  "$worker" "$marker" >"$work/out" 2>"$work/err" || { fail "cvd run failed"; cat "$work/err"; }
expect_line "$work/cvd/workerlog.0" "CUDA_VISIBLE_DEVICES=6,4"
expect_line "$work/cvd/workerlog.1" "DPAR_DEVICE=gpu:1"

echo "== --log_dir='' puts every process on the console behind a rank prefix"
"$launcher" --nproc_per_node=2 --log_dir= --start_port=$port "$worker" lines=1 "$marker" \
  >"$work/out" 2>"$work/err" || { fail "console run failed"; cat "$work/err"; }
expect_line "$work/out" "[rank 0] line 1 of rank 0"
expect_line "$work/out" "[rank 1] line 1 of rank 1"

echo "== a second run into the same --log_dir keeps the first run's logs"
for run in 1 2 3; do
  "$launcher" --nproc_per_node=2 --log_dir="$work/runs" --start_port=$port "$worker" \
    lines=1 "run$run" "$marker" >"$work/out" 2>"$work/err" || { fail "run $run failed"; cat "$work/err"; }
done
expect_text "$work/out" "$work/runs held an earlier run's logs; moved them to $work/runs/previous.2"
expect_line "$work/runs/previous.1/workerlog.1" "line 1 of rank 1"
[ -f "$work/runs/previous.2/workerlog.0" ] && [ ! -e "$work/runs/previous.3" ] &&
  ok "runs 1 and 2 kept in previous.1 and previous.2" || fail "$(ls -R "$work/runs")"

echo "== a rank that exits 0 while the others run on is named"
"$launcher" --nproc_per_node=3 --log_dir="$work/early" --start_port=$port "$worker" sleep=7 \
  rank1.sleep=0 "$marker" >"$work/out" 2>"$work/err" || { fail "early-exit run failed"; cat "$work/err"; }
expect_text "$work/err" "dpar-launch: rank 1 exited with code 0 while ranks 0, 2 still run 5 s later"
"$launcher" --nproc_per_node=2 --log_dir="$work/early" --start_port=$port "$worker" sleep=0.3 \
  "$marker" >"$work/out" 2>"$work/err" || { fail "plain run failed"; cat "$work/err"; }
expect_no_text "$work/err" "exited with code 0 while"

echo "== torchrun's spellings: --standalone, --nproc-per-node, --master_addr/--master_port"
"$launcher" --standalone --nproc-per-node=2 --log_dir="$work/sa" "$worker" "$marker" \
  >"$work/out" 2>"$work/err" || { fail "standalone run failed"; cat "$work/err"; }
expect_line "$work/sa/workerlog.1" "WORLD_SIZE=2"
expect_text "$work/sa/workerlog.0" "MASTER_PORT="
"$launcher" --nnodes=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=$((port + 9)) \
  --nproc_per_node=2 --log_dir="$work/tr" --start_port=$port "$worker" "$marker" \
  >"$work/out" 2>"$work/err" || { fail "torchrun-style run failed"; cat "$work/err"; }
expect_line "$work/tr/workerlog.1" "MASTER_PORT=$((port + 9))"

echo "== --cpu_bind=cores: each process on its own CPUs, one OpenMP thread per CPU"
# The first two CPUs this test may use (Cpus_allowed_list, ranges expanded), whatever they are.
cpus=($(awk '/^Cpus_allowed_list/ {n = split($2, parts, ","); for (i = 1; i <= n; ++i) {
  m = split(parts[i], r, "-"); for (c = r[1]; c <= r[m]; ++c) print c } }' /proc/self/status | head -2))
if [ ${#cpus[@]} -ge 2 ] && command -v taskset >/dev/null; then
  two=${cpus[0]},${cpus[1]}
  # What each process may run on, as the kernel says, and what the launcher told it.
  show='grep Cpus_allowed_list /proc/self/status; echo "OMP_NUM_THREADS=$OMP_NUM_THREADS DPAR_CPUS=$DPAR_CPUS"'
  unset OMP_NUM_THREADS
  taskset -c "$two" "$launcher" --nproc_per_node=2 --cpu_bind=cores --log_dir="$work/bind" \
    --start_port=$port bash -c "$show" "$marker" >"$work/out" 2>"$work/err" ||
    { fail "bound run failed"; cat "$work/err"; }
  for i in 0 1; do
    expect_line "$work/bind/workerlog.$i" "$(printf 'Cpus_allowed_list:\t%s' "${cpus[$i]}")"
    expect_line "$work/bind/workerlog.$i" "OMP_NUM_THREADS=1 DPAR_CPUS=${cpus[$i]}"
  done
  expect_text "$work/out" "| DPAR_CPUS"
  # The caller's OMP_NUM_THREADS wins; the binding stays.
  OMP_NUM_THREADS=3 taskset -c "$two" "$launcher" --nproc_per_node=2 --cpu_bind=cores \
    --log_dir="$work/omp" --start_port=$port bash -c "$show" "$marker" >"$work/out" 2>"$work/err" ||
    { fail "bound run with OMP_NUM_THREADS failed"; cat "$work/err"; }
  expect_line "$work/omp/workerlog.1" "OMP_NUM_THREADS=3 DPAR_CPUS=${cpus[1]}"
  # Unbound (the default), every process may run wherever the launcher may, and an inherited
  # DPAR_CPUS does not reach it.
  DPAR_CPUS=${cpus[0]} taskset -c "$two" "$launcher" --nproc_per_node=2 --log_dir="$work/free" \
    --start_port=$port bash -c "$show" "$marker" >"$work/out" 2>"$work/err" ||
    { fail "unbound run failed"; cat "$work/err"; }
  expect_line "$work/free/workerlog.1" "$(printf 'Cpus_allowed_list:\t%s' "$(taskset -c "$two" \
    grep Cpus_allowed_list /proc/self/status | cut -f2)")"
  expect_line "$work/free/workerlog.1" "OMP_NUM_THREADS=1 DPAR_CPUS="
else
  echo "skip: --cpu_bind needs two CPUs and taskset"
fi

echo "== processes a worker leaves behind end with the job"
"$launcher" --nproc_per_node=2 --log_dir="$work/gc" --start_port=$port \
  "$worker" grandchild=1 sleep=0.2 "$marker" >"$work/out" 2>"$work/err"
rc=$?
[ $rc -eq 0 ] && ok "exit 0" || { fail "exit $rc"; cat "$work/err"; }
expect_text "$work/gc/workerlog.1" "started grandchild"
expect_no_job_processes
finish
