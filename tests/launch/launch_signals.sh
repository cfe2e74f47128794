#!/usr/bin/env bash
# SIGTERM and SIGINT (Ctrl-C) sent to the launcher reach every worker; the launcher exits
# 128+signal and leaves nothing behind.
set -u
source "$(dirname "$0")/common.sh" "$@"
# Job control: background jobs keep SIGINT instead of ignoring it, as from a terminal.
set -m

for sig in TERM INT; do
  echo "== SIG$sig to the launcher"
  record=$work/record.$sig
  "$launcher" --nproc_per_node=3 --log_dir="$work/log.$sig" --start_port=$port \
    "$worker" sleep=30 trap=1 record="$record" grandchild=1 "$marker" \
    >"$work/out" 2>"$work/err" &
  pid=$!
  for i in 0 1 2; do
    wait_for_text "$work/log.$sig/workerlog.$i" "started grandchild" 10 ||
      fail "worker $i did not start"
  done
  t0=$(now_ms)
  kill -s "$sig" $pid
  wait $pid
  rc=$?
  elapsed_ms=$(($(now_ms) - t0))
  want=$((128 + $(kill -l "$sig")))
  [ $rc -eq $want ] && ok "exit $rc" || { fail "exit $rc (want $want)"; cat "$work/err"; }
  [ $elapsed_ms -lt 5000 ] && ok "stopped in ${elapsed_ms} ms" || fail "took ${elapsed_ms} ms"
  for i in 0 1 2; do expect_line "$record" "rank $i got SIG$sig"; done
  expect_text "$work/log.$sig/workerlog.1" "rank 1 got SIG$sig"
  expect_text "$work/err" "got SIG$sig; passing it to 3 local process(es)"
  expect_no_job_processes
done
echo "== a worker that ends early is reaped at once; what it left behind ends with the job"
"$launcher" --nproc_per_node=2 --log_dir="$work/log.early" --start_port=$port \
  "$worker" sleep=30 grandchild=1 exit=0 fail_rank=0 "$marker" >"$work/out" 2>"$work/err" &
pid=$!
wait_for_text "$work/log.early/workerlog.1" "started grandchild" 10 || fail "worker 1 did not start"
wait_for_text "$work/log.early/workerlog.0" "rank 0 failing now" 10 || fail "worker 0 did not end"
sleep 0.3
# Rank 0 exited 0: no zombie under the launcher, and its orphaned child is now the
# launcher's (child subreaper) rather than init's.
children=$(ps --ppid $pid -o pid=,stat=)
if echo "$children" | awk '{print $2}' | grep -q '^Z'; then
  fail "zombie under the launcher: $children"
else
  ok "no zombie under the launcher"
fi
[ "$(echo "$children" | grep -c .)" -eq 2 ] && ok "launcher adopted the orphan" ||
  fail "launcher children: $children"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] && ok "exit 143" || fail "exit $rc (want 143)"
expect_no_job_processes

echo "== the launcher itself is killed (SIGKILL): its workers get SIGKILL from the kernel"
"$launcher" --nproc_per_node=2 --log_dir="$work/log.kill" --start_port=$port \
  "$worker" sleep=30 "$marker" >"$work/out" 2>"$work/err" &
pid=$!
for i in 0 1; do
  wait_for_text "$work/log.kill/workerlog.$i" "DPAR_RANK=$i" 10 || fail "worker $i did not start"
done
kill -KILL $pid
wait $pid 2>/dev/null
for _ in $(seq 40); do pgrep -f -- "$marker" >/dev/null || break; sleep 0.05; done
expect_no_job_processes
finish
