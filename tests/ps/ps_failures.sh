#!/usr/bin/env bash
# Parameter-server failures, each one clear line and a non-zero exit, never a hang:
#   1. servers that never come up: "pserver not ready: <ip:port> (retrying, <n> s elapsed)",
#      then an error after --ps-connect-timeout;
#   2. a trainer with another job's token (or none) is refused by the server;
#   3. a server killed mid-training: dpar-launch stops the job within 10 s naming it and
#      nothing of the job remains; without a launcher, the trainer's error names the server;
#   4. a trainer that dies in sync mode (no launcher to tear the job down): the server and the
#      other trainer fail after --ps-timeout naming the missing trainer id;
#   5. the same under dpar-launch: the launcher names the trainer and stops the servers.
# Usage: ps_failures.sh <train> <dpar-launch> <python3> <source dir>
set -u
source "$(dirname "$0")/common.sh" "$@"
endpoint=127.0.0.1:$port

as_role() {  # ROLE ID ENDPOINTS TRAINERS TOKEN: the environment dpar-launch would give
  local ids=DPAR_TRAINER_ID
  [ "$1" = PSERVER ] && ids=DPAR_SERVER_ID
  echo "TRAINING_ROLE=$1 $ids=$2 DPAR_PSERVER_ENDPOINTS=$3 DPAR_TRAINERS_NUM=$4 DPAR_JOB_TOKEN=$5"
}

echo "== 1. servers that never come up"
t0=$SECONDS
# shellcheck disable=SC2046
env $(as_role TRAINER 0 $endpoint 1 tok) "$train" "${recipe[@]}" --epochs 1 \
  --ps-connect-timeout 4 --output-dir "$work/1" >"$work/1.out" 2>&1
rc=$?
[ $rc -ne 0 ] && ok "trainer exit $rc" || fail "trainer exit 0 without servers"
[ $((SECONDS - t0)) -le 30 ] && ok "gave up in $((SECONDS - t0)) s" || fail "took $((SECONDS - t0)) s"
expect_text "$work/1.out" "pserver not ready: $endpoint (retrying, "
expect_text "$work/1.out" "pserver not ready: $endpoint did not answer within 4 s (--ps-connect-timeout)"

echo "== 2. a trainer of another job"
# shellcheck disable=SC2046
env $(as_role PSERVER 0 $endpoint 1 right_token) "$train" "${recipe[@]}" --ps-timeout 60 \
  --output-dir "$work/2s" >"$work/2s.out" 2>&1 &
server=$!
wait_for_text "$work/2s.out" "listening on $endpoint" 30 || fail "server did not start"
for token in wrong_token ""; do
  # shellcheck disable=SC2046
  env $(as_role TRAINER 0 $endpoint 1 "$token") "$train" "${recipe[@]}" --epochs 1 \
    --ps-connect-timeout 10 --output-dir "$work/2" >"$work/2.out" 2>&1
  rc=$?
  [ $rc -ne 0 ] && ok "trainer with token '$token' exit $rc" || fail "trainer with token '$token' accepted"
  if [ -n "$token" ]; then
    expect_text "$work/2.out" "refuses the call: its job token belongs to another job"
  else
    expect_text "$work/2.out" "refuses the call: it carries no job token"
  fi
done
kill -KILL $server 2>/dev/null
wait $server 2>/dev/null

echo "== 3. a server killed mid-training"
"$launcher" --run_mode=ps --server_num=2 --trainer_num=2 --start_port=$port --log_dir="$work/3/log" \
  "$train" "${recipe[@]}" --epochs 20 --output-dir "$work/3" >"$work/3.out" 2>&1 &
launcher_pid=$!
if wait_for_text "$work/3/log/workerlog.0" "[Epoch 0, iter: 4]" 90; then
  victim=$(sed -n 's/^ps server 1 of 2 listening on .* pid \([0-9]*\)).*/\1/p' "$work/3/log/serverlog.1")
  t_kill=$SECONDS
  kill -KILL "$victim"
  wait $launcher_pid
  rc=$?
  [ $rc -ne 0 ] && ok "launcher exit $rc" || fail "launcher exit 0 after a server died"
  [ $((SECONDS - t_kill)) -le 10 ] && ok "job stopped in $((SECONDS - t_kill)) s" ||
    fail "job took $((SECONDS - t_kill)) s to stop"
  expect_text "$work/3.out" "server 1"
  expect_text "$work/3.out" "SIGKILL"
  grep -qE "ps server 1 \(127.0.0.1:$((port + 1))\) is unreachable" "$work/3/log"/workerlog.* &&
    ok "a trainer names the dead server" || ok "trainers were stopped before they noticed"
else
  fail "training did not start"; tail -n 20 "$work/3.out"
  kill -TERM $launcher_pid; wait $launcher_pid
fi
sleep 0.5
expect_no_job_processes

echo "== 3b. a server killed under a trainer, no launcher: the trainer names it"
# shellcheck disable=SC2046
env $(as_role PSERVER 0 $endpoint 1 tok) "$train" "${recipe[@]}" --output-dir "$work/3bs" \
  >"$work/3bs.out" 2>&1 &
server=$!
# shellcheck disable=SC2046
env $(as_role TRAINER 0 $endpoint 1 tok) "$train" "${recipe[@]}" --epochs 20 \
  --output-dir "$work/3bt" >"$work/3bt.out" 2>&1 &
trainer0=$!
if wait_for_text "$work/3bt.out" "[Epoch 0, iter: 4]" 60; then
  kill -KILL $server
  t_kill=$SECONDS
  wait $trainer0
  rc=$?
  [ $rc -ne 0 ] && ok "trainer exit $rc" || fail "trainer exit 0 after its server died"
  [ $((SECONDS - t_kill)) -le 30 ] && ok "trainer gave up in $((SECONDS - t_kill)) s" ||
    fail "trainer took $((SECONDS - t_kill)) s"
  expect_text "$work/3bt.out" "ps server 0 ($endpoint) is unreachable"
else
  fail "training did not start"; tail -n 20 "$work/3bt.out"
fi
kill -KILL $server $trainer0 2>/dev/null
wait 2>/dev/null

echo "== 4. a trainer that dies in sync mode, no launcher"
# shellcheck disable=SC2046
env $(as_role PSERVER 0 $endpoint 2 tok) "$train" "${recipe[@]}" --ps-timeout 5 \
  --output-dir "$work/4s" >"$work/4s.out" 2>&1 &
server=$!
for t in 0 1; do
  # shellcheck disable=SC2046
  env $(as_role TRAINER $t $endpoint 2 tok) DPAR_TEST_DIE_AT_STEP=3:1 "$train" "${recipe[@]}" \
    --epochs 2 --ps-timeout 5 --output-dir "$work/4t$t" >"$work/4t$t.out" 2>&1 &
  trainer[t]=$!
done
t0=$SECONDS
wait ${trainer[1]}
wait ${trainer[0]}
rc0=$?
wait $server
rcs=$?
[ $rc0 -ne 0 ] && ok "trainer 0 exit $rc0" || fail "trainer 0 exit 0"
[ $rcs -ne 0 ] && ok "server exit $rcs" || fail "server exit 0"
[ $((SECONDS - t0)) -le 60 ] && ok "over in $((SECONDS - t0)) s" || fail "took $((SECONDS - t0)) s"
expect_text "$work/4s.out" "the gradients of trainer(s) 1"
expect_text "$work/4t0.out" "step 3 still lacks the gradients of trainer(s) 1"

echo "== 5. a trainer that dies under dpar-launch"
DPAR_TEST_DIE_AT_STEP=3:1 "$launcher" --run_mode=ps --server_num=2 --trainer_num=2 \
  --start_port=$port --log_dir="$work/5/log" "$train" "${recipe[@]}" --epochs 2 \
  --output-dir "$work/5" >"$work/5.out" 2>&1
rc=$?
[ $rc -ne 0 ] && ok "launcher exit $rc" || fail "launcher exit 0 after a trainer died"
expect_text "$work/5.out" "trainer 1"
sleep 0.5
expect_no_job_processes
finish
