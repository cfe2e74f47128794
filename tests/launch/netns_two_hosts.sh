#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, 10.231.0.1/24 and
# 10.231.0.2/24 (addresses that exist only inside those namespaces). One dpar-launch runs in
# each with --ips=10.231.0.1,10.231.0.2 and finds its node among its own interface addresses,
# as on real machines. The job's program and its arguments are parameters, so the same script
# runs a collective test program later:
#
#   netns_two_hosts.sh [--expect-env | --expect-failure=TEXT] [--nproc=N] [--ps]
#                      [--logs-to=DIR] <dpar-launch> <program> [args...]
#
# Both launchers must exit 0. --expect-env also checks the env_worker output: world size 2N,
# ranks, node ranks and endpoints agree across the two hosts.
#
# --ps runs a parameter-server job instead: one server on each host
# (--servers=10.231.0.1:6070,10.231.0.2:6070) and N trainers on each (--nproc, default 1 with
# --ps; --trainers lists each host's address N times, so host a runs trainers 0..N-1), with
# one random --job_token given to both launchers. --expect-env then checks roles, server and
# trainer ids, the server list, the trainer count and the shared token.
# --expect-failure=TEXT runs a failure drill instead: both launchers must exit non-zero and
# host a's launcher must print TEXT; the two share one flight-record folder (as nodes on a
# shared filesystem would), so the verdict sees both hosts' ranks.
# --logs-to=DIR copies both hosts' launcher output and worker logs to DIR/a and DIR/b (for a
# caller's own checks).
# Exit status: 0 passed, 1 failed, 77 skipped (no CAP_NET_ADMIN or no `ip`; the reason is
# printed). NETNS_TEST_TIMEOUT (default 45 s) bounds each launcher.
set -u
expect_env=0
nproc=
ps=0
expect_failure=
logs_to=
while [ $# -gt 0 ]; do
  case $1 in
    --expect-env) expect_env=1; shift ;;
    --expect-failure=*) expect_failure=${1#--expect-failure=}; shift ;;
    --nproc=*) nproc=${1#--nproc=}; shift ;;
    --ps) ps=1; shift ;;
    --logs-to=*) logs_to=${1#--logs-to=}; shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "usage: $0 [--expect-env | --expect-failure=TEXT] [--nproc=N] [--ps] [--logs-to=DIR] <dpar-launch> <program> [args...]" >&2
  exit 1
fi
[ -n "$nproc" ] || nproc=$((ps ? 1 : 2))
launcher=$1
shift
skip() {
  echo "SKIPPED: $*"
  exit 77
}
command -v ip >/dev/null || skip "the 'ip' tool (iproute2) is not installed"
command -v timeout >/dev/null || skip "coreutils' timeout is not installed"

ns_a=dpar_test_a_$$
ns_b=dpar_test_b_$$
ip_a=10.231.0.1
ip_b=10.231.0.2
work=$(mktemp -d)
cleanup() {
  if [ -n "$logs_to" ]; then
    for node in a b; do
      mkdir -p "$logs_to/$node"
      cp -r "$work/$node/." "$work/$node.out" "$work/$node.err" "$logs_to/$node/" 2>/dev/null
    done
  fi
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
if ! err=$(ip netns add "$ns_a" 2>&1); then
  skip "cannot create a network namespace (needs root or CAP_NET_ADMIN): $err"
fi
ip netns add "$ns_b" || skip "cannot create a second network namespace"
# The veth pair is created inside the first namespace with its peer in the second, so no
# interface ever appears in the machine's own namespace.
setup() {
  ip -n "$ns_a" link add veth_a type veth peer name veth_b netns "$ns_b" &&
    ip -n "$ns_a" addr add "$ip_a/24" dev veth_a &&
    ip -n "$ns_b" addr add "$ip_b/24" dev veth_b &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
    ip -n "$ns_a" link set veth_a up && ip -n "$ns_b" link set veth_b up
}
if ! err=$(setup 2>&1); then
  skip "cannot set up the veth pair between the namespaces (no veth support?): $err"
fi

limit=${NETNS_TEST_TIMEOUT:-45}
port=6070  # the namespaces are fresh: the default ports are free there
# The cluster flags both launchers get.
if [ $ps -eq 1 ]; then
  servers=$ip_a:$port,$ip_b:$port
  trainers=""
  for ip in $ip_a $ip_b; do
    for ((l = 0; l < nproc; l++)); do trainers+="${trainers:+,}$ip"; done
  done
  token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  cluster=(--run_mode=ps --servers="$servers" --trainers="$trainers" --job_token="$token")
else
  cluster=(--ips="$ip_a,$ip_b" --nproc_per_node="$nproc" --start_port=$port)
fi
# run_node NS NAME PROGRAM [ARGS...]: one launcher in namespace NS, logs under $work/NAME.
run_node() {
  local ns=$1 name=$2
  shift 2
  timeout -s TERM "$limit" ip netns exec "$ns" "$launcher" "${cluster[@]}" \
    --log_dir="$work/$name" "$@" >"$work/$name.out" 2>"$work/$name.err"
}
[ -n "$expect_failure" ] && export DPAR_FLIGHT_RECORDER_DIR=$work/flight_recorder
run_node "$ns_a" a "$@" &
pid_a=$!
run_node "$ns_b" b "$@" &
pid_b=$!
wait $pid_a
rc_a=$?
wait $pid_b
rc_b=$?

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
for node in a b; do
  rc_var=rc_$node
  if [ -n "$expect_failure" ]; then
    if [ "${!rc_var}" -ne 0 ] && [ "${!rc_var}" -ne 124 ]; then
      echo "ok: launcher on host $node exited ${!rc_var}"
    else
      fail "launcher on host $node exited ${!rc_var} (a failure drill: non-zero, not the timeout)"
      cat "$work/$node.err"
    fi
  elif [ "${!rc_var}" -ne 0 ]; then
    fail "launcher on host $node exited ${!rc_var}; its stderr and logs:"
    cat "$work/$node.err"
    for f in "$work/$node"/*log.*; do echo "--- $f"; tail -n 20 "$f"; done
  else
    echo "ok: launcher on host $node exited 0"
  fi
done

# expect_lines LOG WHAT KEY=VALUE...: LOG has each line.
expect_lines() {
  local log=$1 what=$2 kv
  shift 2
  for kv in "$@"; do
    if grep -qxF -- "$kv" "$log" 2>/dev/null; then echo "ok: $what: $kv"; else
      fail "$what: $log lacks $kv"
    fi
  done
}

if [ -n "$expect_failure" ]; then
  if grep -qF -- "$expect_failure" "$work/a.err"; then echo "ok: host a printed: $expect_failure"; else
    fail "host a's launcher did not print: $expect_failure; it printed:"
    cat "$work/a.err"
  fi
fi
if [ $expect_env -eq 1 ] && [ $ps -eq 1 ]; then
  node=0
  for name in a b; do
    ip_var=ip_$name
    common=(DPAR_RUN_MODE=ps DPAR_PSERVER_ENDPOINTS=$servers PADDLE_PSERVERS_IP_PORT_LIST=$servers
      DPAR_SERVER_NUM=2 DPAR_TRAINERS_NUM=$((2 * nproc)) DPAR_NNODES=2 DPAR_NODE_RANK=$node
      POD_IP=${!ip_var} DPAR_JOB_ID=dpar-ps-$ip_a-$port DPAR_JOB_TOKEN=$token)
    expect_lines "$work/$name/serverlog.0" "host $name server" TRAINING_ROLE=PSERVER \
      DPAR_SERVER_ID=$node PADDLE_PORT=$port DPAR_CURRENT_ENDPOINT=${!ip_var}:$port "${common[@]}"
    for ((l = 0; l < nproc; l++)); do
      expect_lines "$work/$name/workerlog.$l" "host $name trainer $l" TRAINING_ROLE=TRAINER \
        DPAR_TRAINER_ID=$((node * nproc + l)) "${common[@]}"
    done
    node=$((node + 1))
  done
elif [ $expect_env -eq 1 ]; then
  world=$((2 * nproc))
  endpoints=""
  for ip in $ip_a $ip_b; do
    for ((l = 0; l < nproc; l++)); do endpoints+="${endpoints:+,}$ip:$((port + l))"; done
  done
  node=0
  for name in a b; do
    for ((l = 0; l < nproc; l++)); do
      expect_lines "$work/$name/workerlog.$l" "host $name $l" DPAR_RANK=$((node * nproc + l)) \
        DPAR_WORLD_SIZE=$world DPAR_NODE_RANK=$node DPAR_NNODES=2 DPAR_LOCAL_RANK=$l \
        DPAR_ENDPOINTS=$endpoints DPAR_MASTER=$ip_a:$((port + nproc)) WORLD_SIZE=$world \
        MASTER_ADDR=$ip_a
    done
    node=$((node + 1))
  done
fi
[ $failures -eq 0 ] && echo "all checks passed" && exit 0
echo "$failures check(s) failed"
exit 1
