#!/usr/bin/env bash
# Two "nodes" on one machine: 127.0.0.1 and 127.0.0.2 (every 127/8 address is this machine's
# loopback). The launcher detects 127.0.0.1 among its interface addresses; 127.0.0.2 is not an
# interface address, so its launcher is told with --host (or --node_rank). Both must agree on
# world size, endpoints, master and job id. Also cluster descriptions from a hostfile (uneven
# slots) and a rank table (ranks interleaved across nodes).
set -u
source "$(dirname "$0")/common.sh" "$@"

# two_nodes DIR FLAGS_NODE0 -- FLAGS_NODE1 -- COMMON...: runs both launchers at once.
two_nodes() {
  local dir=$1 a=$2 b=$3
  shift 3
  "$launcher" $a --log_dir="$dir/n0" "$@" >"$dir/out0" 2>"$dir/err0" &
  local p0=$!
  "$launcher" $b --log_dir="$dir/n1" "$@" >"$dir/out1" 2>"$dir/err1" &
  local p1=$!
  wait $p0 || { fail "node 0 launcher failed"; cat "$dir/err0"; }
  wait $p1 || { fail "node 1 launcher failed"; cat "$dir/err1"; }
}

# value LOG KEY
value() { grep -m1 "^$2=" "$1" | cut -d= -f2-; }

echo "== --ips=127.0.0.1,127.0.0.2, 2 processes each"
mkdir -p "$work/ips"
two_nodes "$work/ips" "" "--host=127.0.0.2" --ips=127.0.0.1,127.0.0.2 --nproc_per_node=2 \
  --start_port=$port "$worker" "$marker"
endpoints=127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.2:$port,127.0.0.2:$((port + 1))
for node in 0 1; do
  for local in 0 1; do
    log=$work/ips/n$node/workerlog.$local
    rank=$((node * 2 + local))
    for kv in DPAR_RANK=$rank DPAR_WORLD_SIZE=4 DPAR_LOCAL_RANK=$local DPAR_LOCAL_SIZE=2 \
        DPAR_NODE_RANK=$node DPAR_NNODES=2 DPAR_ENDPOINTS=$endpoints \
        DPAR_MASTER=127.0.0.1:$((port + 2)) DPAR_JOB_ID=dpar-127.0.0.1-$((port + 2)) \
        PADDLE_TRAINER_ID=$rank PADDLE_TRAINERS_NUM=4 RANK=$rank WORLD_SIZE=4 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 2)); do
      expect_line "$log" "$kv"
    done
  done
done
expect_line "$work/ips/n1/workerlog.1" "DPAR_CURRENT_ENDPOINT=127.0.0.2:$((port + 1))"
expect_text "$work/ips/out0" "node 0 of 2 (127.0.0.1), ranks 0..1 of 4"
expect_text "$work/ips/out1" "node 1 of 2 (127.0.0.2), ranks 2..3 of 4"

echo "== the same with --node_rank and a job id"
mkdir -p "$work/nr"
two_nodes "$work/nr" "--node_rank=0" "--node_rank=1" --ips=127.0.0.1,127.0.0.2 \
  --nproc_per_node=2 --start_port=$port --job_id=myjob "$worker" "$marker"
expect_line "$work/nr/n1/workerlog.0" "DPAR_RANK=2"
expect_line "$work/nr/n1/workerlog.0" "DPAR_JOB_ID=myjob"
expect_line "$work/nr/n0/workerlog.1" "DPAR_JOB_ID=myjob"

echo "== hostfile with uneven slots"
mkdir -p "$work/hf"
cat >"$work/hosts" <<HOSTS
# two nodes on loopback
127.0.0.1 slots=1
127.0.0.2 slots=3   # the second has more
HOSTS
two_nodes "$work/hf" "" "--host=127.0.0.2" --hostfile="$work/hosts" --start_port=$port \
  "$worker" "$marker"
# The largest node has 3 processes, so the store is on the port after start_port+2.
for local in 0 1 2; do
  log=$work/hf/n1/workerlog.$local
  expect_line "$log" "DPAR_RANK=$((local + 1))"
  expect_line "$log" "DPAR_LOCAL_SIZE=3"
  expect_line "$log" "DPAR_WORLD_SIZE=4"
  expect_line "$log" "DPAR_MASTER=127.0.0.1:$((port + 3))"
done
expect_line "$work/hf/n0/workerlog.0" "DPAR_LOCAL_SIZE=1"
[ "$(value "$work/hf/n0/workerlog.0" DPAR_ENDPOINTS)" = \
  "$(value "$work/hf/n1/workerlog.2" DPAR_ENDPOINTS)" ] && ok "nodes agree on endpoints" ||
  fail "nodes disagree on endpoints"

echo "== rank table with ranks interleaved across the nodes"
mkdir -p "$work/rt"
cat >"$work/ranks.json" <<JSON
{"version": "1.0", "server_count": "2", "server_list": [
  {"server_id": "127.0.0.1", "device": [
     {"device_id": "0", "device_ip": "192.0.2.10", "rank_id": "2"},
     {"device_id": "1", "device_ip": "192.0.2.11", "rank_id": "0"}]},
  {"server_id": "127.0.0.2", "device": [
     {"device_id": 3, "rank_id": 1},
     {"device_id": 2, "rank_id": 3}]}],
 "status": "completed"}
JSON
# Both "nodes" are this machine, which may have no GPU: the inherited list declares the devices.
export CUDA_VISIBLE_DEVICES=0,1,2,3
two_nodes "$work/rt" "" "--host=127.0.0.2" --rank_table="$work/ranks.json" --start_port=$port \
  "$worker" "$marker"
# Local ranks follow rank_id within a node: node 0 runs rank 0 (device 1) then rank 2 (device 0).
expect_line "$work/rt/n0/workerlog.0" "DPAR_RANK=0"
expect_line "$work/rt/n0/workerlog.0" "CUDA_VISIBLE_DEVICES=1,0"
expect_line "$work/rt/n0/workerlog.1" "DPAR_RANK=2"
expect_line "$work/rt/n0/workerlog.1" "DPAR_DEVICE=gpu:1"
expect_line "$work/rt/n1/workerlog.0" "DPAR_RANK=1"
expect_line "$work/rt/n1/workerlog.1" "CUDA_VISIBLE_DEVICES=3,2"
rt_endpoints=127.0.0.1:$port,127.0.0.2:$port,127.0.0.1:$((port + 1)),127.0.0.2:$((port + 1))
expect_line "$work/rt/n1/workerlog.1" "DPAR_ENDPOINTS=$rt_endpoints"
expect_line "$work/rt/n1/workerlog.1" "DPAR_CURRENT_ENDPOINT=127.0.0.2:$((port + 1))"
expect_line "$work/rt/n0/workerlog.1" "DPAR_WORLD_SIZE=4"
finish
