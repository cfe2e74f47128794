#!/usr/bin/env bash
# Parameter-server mode (--run_mode=ps): each server and trainer gets its role's environment
# (dpar and PaddlePaddle names) and log file (serverlog.N / workerlog.N), the console echoes
# trainer 0, all processes share one job token that the launcher never prints; one launcher per
# node with --servers/--trainers; a failing server or trainer is named and the job torn down;
# servers that do not stop after all trainers finished are stopped and named.
set -u
source "$(dirname "$0")/common.sh" "$@"
unset OMP_NUM_THREADS DPAR_JOB_TOKEN

# value LOG KEY
value() { grep -m1 "^$2=" "$1" | cut -d= -f2-; }

# expect_token_hidden TOKEN OUT ERR: the launcher never shows the job token: not in the table
# on the console (OUT; the echo of trainer 0's environment dump there is the program's own
# output) and nowhere on stderr (ERR).
expect_token_hidden() {
  if grep '^|' "$2" | grep -qF -- "$1"; then fail "the table in $2 shows the job token"; else
    ok "the table does not show the job token"
  fi
  if grep -qF -- "$1" "$3"; then fail "$3 shows the job token"; else
    ok "stderr does not show the job token"
  fi
}

echo "== one node: --server_num=2 --trainer_num=2"
"$launcher" --run_mode=ps --server_num=2 --trainer_num=2 --log_dir="$work/one" --start_port=$port \
  "$worker" lines=2 sleep=0.3 "$marker" >"$work/out" 2>"$work/err"
rc=$?
[ $rc -eq 0 ] && ok "exit 0" || { fail "exit $rc"; cat "$work/err"; }
servers=127.0.0.1:$port,127.0.0.1:$((port + 1))
omp=$(($(nproc) / 2))
[ $omp -lt 1 ] && omp=1
common=(DPAR_RUN_MODE=ps DPAR_PSERVER_ENDPOINTS=$servers PADDLE_PSERVERS_IP_PORT_LIST=$servers
  DPAR_SERVER_NUM=2 DPAR_TRAINERS_NUM=2 PADDLE_TRAINERS_NUM=2 DPAR_JOB_ID=dpar-ps-127.0.0.1-$port
  POD_IP=127.0.0.1 DPAR_NODE_RANK=0 DPAR_NNODES=1 DPAR_RESTART_COUNT=0 DPAR_DEVICE=cpu)
collective=(DPAR_RANK= DPAR_WORLD_SIZE= DPAR_MASTER= RANK= WORLD_SIZE= MASTER_ADDR= MASTER_PORT=
  PADDLE_TRAINER_ENDPOINTS=)
for i in 0 1; do
  log=$work/one/serverlog.$i
  [ -f "$log" ] || { fail "no $log"; continue; }
  for kv in TRAINING_ROLE=PSERVER "${common[@]}" DPAR_SERVER_ID=$i PADDLE_PORT=$((port + i)) \
      DPAR_CURRENT_ENDPOINT=127.0.0.1:$((port + i)) PADDLE_CURRENT_ENDPOINT=127.0.0.1:$((port + i)) \
      OMP_NUM_THREADS=1 "line 2 of server $i" "server $i done"; do
    expect_line "$log" "$kv"
  done
  for key in DPAR_TRAINER_ID= PADDLE_TRAINER_ID= "${collective[@]}"; do
    grep -q "^$key" "$log" && fail "$log sets $key" || ok "serverlog.$i has no $key"
  done
done
for i in 0 1; do
  log=$work/one/workerlog.$i
  [ -f "$log" ] || { fail "no $log"; continue; }
  for kv in TRAINING_ROLE=TRAINER "${common[@]}" DPAR_TRAINER_ID=$i PADDLE_TRAINER_ID=$i \
      OMP_NUM_THREADS=$omp "line 2 of trainer $i" "trainer $i done"; do
    expect_line "$log" "$kv"
  done
  for key in DPAR_SERVER_ID= PADDLE_PORT= DPAR_CURRENT_ENDPOINT= "${collective[@]}"; do
    grep -q "^$key" "$log" && fail "$log sets $key" || ok "workerlog.$i has no $key"
  done
done
[ -e "$work/one/serverlog.2" ] || [ -e "$work/one/workerlog.2" ] && fail "extra log files"
token=$(value "$work/one/serverlog.0" DPAR_JOB_TOKEN)
[[ $token =~ ^[0-9a-f]{32}$ ]] && ok "token is 32 hex characters" || fail "token '$token'"
for f in serverlog.1 workerlog.0 workerlog.1; do
  [ "$(value "$work/one/$f" DPAR_JOB_TOKEN)" = "$token" ] && ok "$f has the same token" ||
    fail "$f has another token"
done
# The console: the table and summary, then trainer 0's output only.
expect_text "$work/out" "Parameter-server environment of trainer 0"
expect_text "$work/out" "| DPAR_JOB_TOKEN "
expect_text "$work/out" "| (set) "
expect_text "$work/out" "| DPAR_PSERVER_ENDPOINTS "
expect_text "$work/out" "dpar-launch: ps mode, node 0 of 1 (127.0.0.1): servers 0..1 at $servers, trainers 0..1 of 2, $worker, logs in $work/one/serverlog.0..1, $work/one/workerlog.0..1"
expect_line "$work/out" "TRAINING_ROLE=TRAINER"
expect_line "$work/out" "trainer 0 done"
expect_no_text "$work/out" "trainer 1 done"
expect_no_text "$work/out" "of server"
expect_no_text "$work/out" "TRAINING_ROLE=PSERVER"
expect_no_text "$work/err" "no --job_token given"
expect_token_hidden "$token" "$work/out" "$work/err"
expect_no_job_processes

echo "== the token from DPAR_JOB_TOKEN, and --job_token over it; --worker_num alias"
DPAR_JOB_TOKEN=envtoken5821 "$launcher" --run_mode=ps --server_num=1 --worker_num=1 \
  --log_dir="$work/env" --start_port=$port "$worker" "$marker" >"$work/out" 2>"$work/err" ||
  { fail "DPAR_JOB_TOKEN run failed"; cat "$work/err"; }
expect_line "$work/env/serverlog.0" "DPAR_JOB_TOKEN=envtoken5821"
expect_line "$work/env/workerlog.0" "DPAR_JOB_TOKEN=envtoken5821"
expect_token_hidden envtoken5821 "$work/out" "$work/err"
DPAR_JOB_TOKEN=envtoken5821 "$launcher" --run_mode=ps --server_num=1 --trainer_num=1 \
  --job_token=flagtoken7730 --log_dir="$work/flag" --start_port=$port "$worker" "$marker" \
  >"$work/out" 2>"$work/err" || { fail "--job_token run failed"; cat "$work/err"; }
expect_line "$work/flag/serverlog.0" "DPAR_JOB_TOKEN=flagtoken7730"
expect_line "$work/flag/workerlog.0" "DPAR_JOB_TOKEN=flagtoken7730"
expect_token_hidden flagtoken7730 "$work/out" "$work/err"

echo "== --log_dir='': every process on the console, named by role"
"$launcher" --run_mode=ps --server_num=1 --trainer_num=2 --log_dir= --start_port=$port \
  "$worker" lines=1 "$marker" >"$work/out" 2>"$work/err" || { fail "console run failed"; cat "$work/err"; }
expect_line "$work/out" "[server 0] line 1 of server 0"
expect_line "$work/out" "[trainer 0] line 1 of trainer 0"
expect_line "$work/out" "[trainer 1] line 1 of trainer 1"
expect_text "$work/out" "trainers 0..1 of 2, $worker, output on the console"

echo "== two nodes (127.0.0.1, 127.0.0.2), one launcher each, --servers/--trainers"
servers2=127.0.0.1:$port,127.0.0.2:$port
# Trainer entries may carry a port (as PaddlePaddle writes them); it is not used.
flags=(--run_mode=ps --servers=$servers2 --trainers=127.0.0.1,127.0.0.2:9999,127.0.0.2)
"$launcher" "${flags[@]}" --log_dir="$work/two/n0" "$worker" sleep=0.3 "$marker" \
  >"$work/out0" 2>"$work/err0" &
p0=$!
"$launcher" "${flags[@]}" --host=127.0.0.2 --log_dir="$work/two/n1" "$worker" sleep=0.3 "$marker" \
  >"$work/out1" 2>"$work/err1" &
p1=$!
wait $p0 && ok "node 0 launcher exit 0" || { fail "node 0 launcher failed"; cat "$work/err0"; }
wait $p1 && ok "node 1 launcher exit 0" || { fail "node 1 launcher failed"; cat "$work/err1"; }
omp2=$(($(nproc) / 2))
[ $omp2 -lt 1 ] && omp2=1
# node: log file -> expected lines
declare -A want=(
  [n0/serverlog.0]="TRAINING_ROLE=PSERVER DPAR_SERVER_ID=0 PADDLE_PORT=$port POD_IP=127.0.0.1 DPAR_NODE_RANK=0 PADDLE_CURRENT_ENDPOINT=127.0.0.1:$port"
  [n0/workerlog.0]="TRAINING_ROLE=TRAINER DPAR_TRAINER_ID=0 POD_IP=127.0.0.1 DPAR_NODE_RANK=0 OMP_NUM_THREADS=$(nproc)"
  [n1/serverlog.0]="TRAINING_ROLE=PSERVER DPAR_SERVER_ID=1 PADDLE_PORT=$port POD_IP=127.0.0.2 DPAR_NODE_RANK=1 DPAR_CURRENT_ENDPOINT=127.0.0.2:$port"
  [n1/workerlog.0]="TRAINING_ROLE=TRAINER DPAR_TRAINER_ID=1 PADDLE_TRAINER_ID=1 POD_IP=127.0.0.2 DPAR_NODE_RANK=1 OMP_NUM_THREADS=$omp2"
  [n1/workerlog.1]="TRAINING_ROLE=TRAINER DPAR_TRAINER_ID=2 POD_IP=127.0.0.2 DPAR_NODE_RANK=1 OMP_NUM_THREADS=$omp2"
)
token2=$(value "$work/two/n0/serverlog.0" DPAR_JOB_TOKEN)
[[ $token2 =~ ^[0-9a-f]{16}$ ]] && ok "derived token (16 hex characters)" || fail "token '$token2'"
for f in "${!want[@]}"; do
  log=$work/two/$f
  [ -f "$log" ] || { fail "no $log"; continue; }
  for kv in ${want[$f]} DPAR_NNODES=2 DPAR_PSERVER_ENDPOINTS=$servers2 DPAR_SERVER_NUM=2 \
      DPAR_TRAINERS_NUM=3 PADDLE_TRAINERS_NUM=3 DPAR_JOB_ID=dpar-ps-127.0.0.1-$port \
      DPAR_JOB_TOKEN=$token2; do
    expect_line "$log" "$kv"
  done
done
[ -e "$work/two/n0/workerlog.1" ] && fail "node 0 runs a second trainer"
for n in 0 1; do
  expect_text "$work/err$n" "dpar-launch: no --job_token given for a multi-node ps job: using one derived from the job id (keeps jobs apart, is not a secret; pass the same --job_token to every node's launcher to protect the servers)"
  expect_token_hidden "$token2" "$work/out$n" "$work/err$n"
done
expect_text "$work/out0" "ps mode, node 0 of 2 (127.0.0.1): servers 0 at 127.0.0.1:$port, trainers 0 of 3"
expect_text "$work/out1" "ps mode, node 1 of 2 (127.0.0.2): servers 1 at 127.0.0.2:$port, trainers 1..2 of 3"
expect_text "$work/out1" "logs in $work/two/n1/serverlog.0, $work/two/n1/workerlog.0..1"
expect_no_job_processes

echo "== server 1 exits with code 3"
run_timed "$work/out" "$work/err" --run_mode=ps --server_num=2 --trainer_num=2 \
  --log_dir="$work/fail" --start_port=$port "$worker" sleep=30 exit=3 fail_role=PSERVER \
  fail_rank=1 fail_after=0.3 "$marker"
[ $rc -ne 0 ] && ok "exit $rc" || fail "exit 0 (want non-zero)"
[ $elapsed_ms -lt 10000 ] && ok "stopped in ${elapsed_ms} ms" || fail "took ${elapsed_ms} ms"
expect_text "$work/err" "server 1 (127.0.0.1:$((port + 1)), pid"
expect_text "$work/err" "exited with code 3; stopping the other 3 local processes"
expect_text "$work/err" "lines of $work/fail/serverlog.1:"
expect_text "$work/err" "    server 1 failing now"
expect_text "$work/err" "job failed: server 1 exited with code 3 (full log: $work/fail/serverlog.1)"
expect_no_job_processes

echo "== trainer 0 is killed by SIGKILL"
run_timed "$work/out" "$work/err" --run_mode=ps --server_num=2 --trainer_num=2 \
  --log_dir="$work/kill" --start_port=$port "$worker" sleep=30 signal=KILL fail_role=TRAINER \
  fail_rank=0 fail_after=0.3 "$marker"
[ $rc -eq 1 ] && ok "exit 1" || fail "exit $rc (want 1)"
[ $elapsed_ms -lt 10000 ] && ok "stopped in ${elapsed_ms} ms" || fail "took ${elapsed_ms} ms"
expect_text "$work/err" "trainer 0 (pid "
expect_text "$work/err" ") was killed by signal 9 (SIGKILL); stopping the other 3 local processes"
expect_text "$work/err" "job failed: trainer 0 was killed by signal 9 (SIGKILL)"
expect_no_job_processes

echo "== --max_restarts=1: trainer 1 fails on the first start only"
run_timed "$work/out" "$work/err" --run_mode=ps --server_num=1 --trainer_num=2 \
  --log_dir="$work/restart" --start_port=$port --max_restarts=1 "$worker" sleep=0.3 exit=4 \
  fail_role=TRAINER fail_rank=1 fail_restart=0 fail_after=0.1 "$marker"
[ $rc -eq 0 ] && ok "exit 0 after the restart" || { fail "exit $rc (want 0)"; cat "$work/err"; }
expect_text "$work/err" "trainer 1 exited with code 4; restarting all 3 local process(es) (restart 1 of 1)"
expect_line "$work/restart/serverlog.0" "DPAR_RESTART_COUNT=1"
expect_line "$work/restart/workerlog.1" "trainer 1 done"

echo "== servers that do not stop after all trainers finished"
run_timed "$work/out" "$work/err" --run_mode=ps --server_num=2 --trainer_num=2 \
  --log_dir="$work/stop" --start_port=$port --server_stop_timeout=1 --grace_period=1 \
  "$worker" sleep=0.2 server.sleep=60 "$marker"
[ $rc -eq 1 ] && ok "exit 1" || fail "exit $rc (want 1)"
[ $elapsed_ms -ge 1000 ] && [ $elapsed_ms -lt 10000 ] && ok "stopped in ${elapsed_ms} ms" ||
  fail "took ${elapsed_ms} ms (want 1-10 s)"
expect_text "$work/err" "server 0 did not stop within 1 s after all trainers finished (127.0.0.1:$port, pid"
expect_text "$work/err" "server 1 did not stop within 1 s after all trainers finished"
expect_text "$work/err" "job failed: servers 0, 1 did not stop within 1 s after all trainers finished"
expect_line "$work/stop/workerlog.1" "trainer 1 done"
expect_no_text "$work/stop/serverlog.0" "server 0 done"
expect_no_job_processes
finish
