#!/usr/bin/env bash
# A failing rank stops the job on the node: the launcher names the rank, its exit code or
# signal and shows its log tail, exits 1 within seconds, and leaves no process behind.
# --max_restarts restarts all local workers.
set -u
source "$(dirname "$0")/common.sh" "$@"

zombies_before=$(ps -eo stat=,comm= | awk '$1 ~ /^Z/ && $2 == "env_worker"' | wc -l)

echo "== rank 1 exits with code 3"
run_timed "$work/out" "$work/err" --nproc_per_node=3 --log_dir="$work/log" --start_port=$port \
  "$worker" sleep=30 lines=25 exit=3 fail_rank=1 fail_after=0.3 "$marker"
[ $rc -eq 1 ] && ok "exit 1" || fail "exit $rc (want 1)"
[ $elapsed_ms -lt 5000 ] && ok "stopped in ${elapsed_ms} ms" || fail "took ${elapsed_ms} ms"
expect_text "$work/err" "rank 1 (local rank 1, pid"
expect_text "$work/err" "exited with code 3; stopping the other 2 local processes"
expect_text "$work/err" "last 20 lines of $work/log/workerlog.1:"
expect_text "$work/err" "    line 25 of rank 1"
expect_text "$work/err" "    rank 1 failing now"
expect_text "$work/err" "    line 7 of rank 1"
expect_no_text "$work/err" "line 6 of rank 1"
expect_text "$work/err" "job failed: rank 1 exited with code 3 (full log: $work/log/workerlog.1)"
expect_no_job_processes

echo "== rank 2 kills itself with SIGKILL; every worker has a child of its own"
run_timed "$work/out" "$work/err" --nproc_per_node=3 --log_dir="$work/log" --start_port=$port \
  "$worker" sleep=30 grandchild=1 signal=KILL fail_rank=2 fail_after=0.3 "$marker"
[ $rc -eq 1 ] && ok "exit 1" || fail "exit $rc (want 1)"
[ $elapsed_ms -lt 10000 ] && ok "stopped in ${elapsed_ms} ms" || fail "took ${elapsed_ms} ms"
expect_text "$work/err" "rank 2 (local rank 2, pid"
expect_text "$work/err" "was killed by signal 9 (SIGKILL)"
expect_text "$work/err" "    rank 2 failing now"
expect_no_job_processes
# A zombie shows no arguments, so count env_worker zombies (the launcher would have left them
# to init) against the count before this test.
zombies=$(ps -eo stat=,comm= | awk '$1 ~ /^Z/ && $2 == "env_worker"' | wc -l)
[ "$zombies" -le "$zombies_before" ] && ok "no zombies" || fail "$zombies env_worker zombies"

echo "== a worker that ignores SIGTERM gets SIGKILL after the grace period"
run_timed "$work/out" "$work/err" --nproc_per_node=2 --log_dir="$work/log" --start_port=$port \
  --grace_period=1 "$worker" sleep=30 ignore_term=1 exit=5 fail_rank=0 fail_after=0.3 "$marker"
[ $rc -eq 1 ] && ok "exit 1" || fail "exit $rc (want 1)"
[ $elapsed_ms -ge 1000 ] && [ $elapsed_ms -lt 5000 ] && ok "stopped in ${elapsed_ms} ms" ||
  fail "took ${elapsed_ms} ms (want 1-5 s)"
expect_text "$work/err" "1 local process(es) still running after 1 s; sending SIGKILL"
expect_no_job_processes

echo "== --max_restarts=1: rank 0 fails on the first start only"
run_timed "$work/out" "$work/err" --nproc_per_node=2 --log_dir="$work/restart" \
  --start_port=$port --max_restarts=1 "$worker" sleep=0.3 exit=3 fail_rank=0 fail_restart=0 \
  fail_after=0.2 \
  "$marker"
[ $rc -eq 0 ] && ok "exit 0 after the restart" || { fail "exit $rc (want 0)"; cat "$work/err"; }
expect_text "$work/err" "rank 0 exited with code 3; restarting all 2 local process(es) (restart 1 of 1)"
for i in 0 1; do
  expect_line "$work/restart/workerlog.$i" "DPAR_RESTART_COUNT=0"
  expect_line "$work/restart/workerlog.$i" "DPAR_RESTART_COUNT=1"
  expect_text "$work/restart/workerlog.$i" "----- dpar-launch: restart 1 of 1 -----"
done
expect_line "$work/restart/workerlog.0" "rank 0 done"

echo "== --max_restarts=1 with a rank that always fails"
run_timed "$work/out" "$work/err" --nproc_per_node=2 --log_dir="$work/log" --start_port=$port \
  --max_restarts=1 "$worker" sleep=30 exit=4 fail_rank=1 "$marker"
[ $rc -eq 1 ] && ok "exit 1" || fail "exit $rc (want 1)"
expect_text "$work/err" "(restart 1 of 1)"
expect_text "$work/err" "job failed: rank 1 exited with code 4"
expect_no_job_processes
finish
