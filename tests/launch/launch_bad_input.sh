#!/usr/bin/env bash
# Bad input: one clear line on stderr, exit status 2, nothing started (no table, no log
# directory, no worker process).
set -u
source "$(dirname "$0")/common.sh" "$@"

# expect_bad TEXT args...: the launcher rejects args with one stderr line containing TEXT.
expect_bad() {
  local text=$1
  shift
  rm -rf "$work/log"
  "$launcher" --log_dir="$work/log" --start_port=$port "$@" >"$work/out" 2>"$work/err"
  local rc=$? lines
  lines=$(wc -l <"$work/err")
  if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$text" "$work/err"; then
    fail "dpar-launch $* -> exit $rc (want 2), stderr ($lines lines, want 1 with '$text'):"
    sed 's/^/    /' "$work/err"
  elif [ -s "$work/out" ] || [ -e "$work/log" ] || pgrep -f -- "$marker" >/dev/null; then
    fail "dpar-launch $* started something"
  else
    ok "$* -> $(cat "$work/err")"
  fi
}

W=("$worker" "$marker")
expect_bad "--ips=1.2.3: '1.2.3' is not an IPv4 address" --ips=1.2.3 "${W[@]}"
expect_bad "--ips=127.0.0.1,,127.0.0.2: empty entry" --ips=127.0.0.1,,127.0.0.2 "${W[@]}"
expect_bad "'node-a' is not an IPv4 address" --ips=node-a,node-b "${W[@]}"
expect_bad "--gpus=0,x: 'x' is not a GPU id" --gpus=0,x "${W[@]}"
expect_bad "--gpus=0,0: GPU 0 listed twice" --gpus=0,0 "${W[@]}"
expect_bad "--gpus=-1: '-1' is not a GPU id" --devices=-1 "${W[@]}"
expect_bad "--gpus is empty" --gpus= "${W[@]}"
expect_bad "this host is not in --ips=10.231.99.1,10.231.99.2 (local addresses: 127.0.0.1" \
  --ips=10.231.99.1,10.231.99.2 "${W[@]}"
expect_bad "nodes 0 and 1 have the same address 127.0.0.1, so their ranks would get duplicate endpoints" \
  --ips=127.0.0.1,127.0.0.1 "${W[@]}"
expect_bad "--master=127.0.0.1:$port is also the endpoint of rank 0 (duplicate endpoint)" \
  --master=127.0.0.1:$port "${W[@]}"
expect_bad "--master=localhost: expected ip:port" --master=localhost "${W[@]}"
expect_bad "--nproc_per_node=0: expected at least 1 process per node" --nproc_per_node=0 "${W[@]}"
expect_bad "--cpu_bind=numa: expected none or cores" --cpu_bind=numa "${W[@]}"
expect_bad "--cpu_bind=cores applies to collective jobs" --run_mode=ps --server_num=1 \
  --trainer_num=1 --cpu_bind=cores "${W[@]}"
# More processes than CPUs to bind them to: the launcher may use one CPU (the first it has).
if command -v taskset >/dev/null; then
  first_cpu=$(awk '/^Cpus_allowed_list/ {split($2, r, "[-,]"); print r[1]}' /proc/self/status)
  launcher_unbound=$launcher
  launcher=$work/taskset_launcher.sh
  printf '#!/bin/sh\nexec taskset -c %s "%s" "$@"\n' "$first_cpu" "$launcher_unbound" >"$launcher"
  chmod +x "$launcher"
  expect_bad "--cpu_bind=cores needs a CPU for each of this node's 2 processes, but the launcher may use 1 (CPUs $first_cpu)" \
    --nproc_per_node=2 --cpu_bind=cores "${W[@]}"
  launcher=$launcher_unbound
else
  echo "skip: the too-few-CPUs case needs taskset"
fi
expect_bad "--nproc_per_node=-2: expected at least 1" --nproc_per_node -2 "${W[@]}"
expect_bad "--nproc_per_node=3 does not match --gpus=0,1" --nproc_per_node=3 --gpus=0,1 "${W[@]}"
expect_bad "--node_rank=2: --ips=127.0.0.1,127.0.0.2 has 2 node(s), so expected 0..1" \
  --ips=127.0.0.1,127.0.0.2 --node_rank=2 "${W[@]}"
expect_bad "--host=127.0.0.3 is not one of the nodes in --ips=127.0.0.1,127.0.0.2" \
  --ips=127.0.0.1,127.0.0.2 --host=127.0.0.3 "${W[@]}"
expect_bad "--run_mode=hybrid: expected collective or ps" --run_mode=hybrid "${W[@]}"
expect_bad "unknown flag --nprocs" --nprocs=2 "${W[@]}"
expect_bad "unknown flag --nproc_per_nod (did you mean --nproc-per-node?" --nproc_per_nod=2 "${W[@]}"
expect_bad "unknown flag -n (flags start with --; did you mean one of --nnodes, --node-rank, --nproc-per-node?" \
  -n 2 "${W[@]}"
expect_bad "--nnodes=1:4 is an elastic job: give --rdzv_endpoint=host:port" --nnodes=1:4 "${W[@]}"
expect_bad "--nnodes=2 needs the nodes' addresses: give --ips=" --nnodes=2 "${W[@]}"
expect_bad "--nnodes=3 but --ips=127.0.0.1,127.0.0.2 lists 2 node(s)" \
  --ips=127.0.0.1,127.0.0.2 --nnodes=3 "${W[@]}"
expect_bad "--start_port=abc: expected an integer" --start_port=abc "${W[@]}"
expect_bad "--start_port=70000: expected a port in 1..65535" --start_port=70000 "${W[@]}"
expect_bad "--max_restarts=-1: expected 0 or more" --max_restarts=-1 "${W[@]}"
expect_bad "no program given" --nproc_per_node=2
expect_bad "program '$marker-missing' not found in PATH" "$marker-missing"
expect_bad "program /nonexistent/$marker: No such file or directory" "/nonexistent/$marker"
printf '#!/bin/sh\n' >"$work/not_exec"
chmod 644 "$work/not_exec"
expect_bad "program $work/not_exec: is not executable" "$work/not_exec" "$marker"
expect_bad "program $work: is a directory" "$work" "$marker"
CUDA_VISIBLE_DEVICES=4,5 expect_bad "GPU 0 is not in this launcher's CUDA_VISIBLE_DEVICES=4,5" \
  --gpus=0 "${W[@]}"

echo "== GPUs that are not devices of this machine"
# Without an inherited CUDA_VISIBLE_DEVICES each id must be below this machine's CUDA device
# count. No machine has a millionth GPU; the reason is the count ("it has 2 CUDA devices:
# 0,1") or why there is none ("dpar was built without CUDA", "no CUDA device ...",
# "no NVIDIA driver ...").
unset CUDA_VISIBLE_DEVICES
device_reason='\((it has 1 CUDA device: 0|it has [0-9]+ CUDA devices: 0(,1|\.\.[0-9]+)|dpar was built without CUDA|no CUDA device.*|no NVIDIA driver .*|CUDA is not usable here: .*)\)$'
# expect_bad_gpu TEXT args...: expect_bad, and the line ends with the device count or reason.
expect_bad_gpu() {
  expect_bad "$@"
  grep -qE -- "$device_reason" "$work/err" && ok "names the device count or why there is none" ||
    fail "no device count or reason in: $(cat "$work/err")"
}
expect_bad_gpu "dpar-launch: --gpus=999999: GPU 999999 is not a device of this machine (" \
  --gpus=999999 "${W[@]}"
# Only this node's GPUs are checked, against this machine: the same on every node.
expect_bad_gpu "--gpus=999998: GPU 999998 is not a device of this machine (" \
  --ips=127.0.0.1,127.0.0.2 --gpus=999998 "${W[@]}"
printf '{"server_list": [{"server_id": "127.0.0.1", "device": [{"device_id": "999999", "rank_id": "0"}]}]}' \
  >"$work/big.json"
expect_bad_gpu "--rank_table=$work/big.json: GPU 999999 is not a device of this machine (" \
  --rank_table="$work/big.json" "${W[@]}"
# On a machine without a GPU, GPU 0 is refused as well.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU 0'; then
  expect_bad_gpu "dpar-launch: --gpus=0,1: GPU 0 is not a device of this machine (" --gpus=0,1 \
    "${W[@]}"
fi

echo "== ps mode"
P=(--run_mode=ps)
expect_bad "--servers=127.0.0.1: entry '127.0.0.1': expected ip:port" \
  "${P[@]}" --servers=127.0.0.1 --trainer_num=1 "${W[@]}"
expect_bad "--servers=127.0.0.1:99999: entry '127.0.0.1:99999': expected ip:port" \
  "${P[@]}" --servers=127.0.0.1:99999 --trainer_num=1 "${W[@]}"
expect_bad "--servers=127.0.0.1:$port,,127.0.0.1:1: empty entry" \
  "${P[@]}" --servers=127.0.0.1:$port,,127.0.0.1:1 --trainer_num=1 "${W[@]}"
expect_bad "duplicate server endpoint 127.0.0.1:$port (servers 0 and 1)" \
  "${P[@]}" --servers=127.0.0.1:$port,127.0.0.1:$port --trainers=127.0.0.1 "${W[@]}"
three=127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))
expect_bad "--server_num=2 but --servers=$three lists 3 server(s)" \
  "${P[@]}" --server_num=2 --servers=$three --trainer_num=1 "${W[@]}"
expect_bad "--trainer_num=3 but --trainers=127.0.0.1,127.0.0.1 lists 2 trainer(s)" \
  "${P[@]}" --server_num=1 --trainers=127.0.0.1,127.0.0.1 --trainer_num=3 "${W[@]}"
expect_bad "--trainers=127.0.0.1,x: entry 'x': expected an IPv4 address" \
  "${P[@]}" --server_num=1 --workers=127.0.0.1,x "${W[@]}"
expect_bad "--trainers needs --run_mode=ps" --trainers=127.0.0.1 "${W[@]}"
expect_bad "--server_num needs --run_mode=ps" --run_mode=collective --server_num=1 "${W[@]}"
ps_only="cannot be used with --run_mode=ps: ps mode runs CPU trainers described by --servers/--trainers or --server_num/--trainer_num"
expect_bad "--gpus $ps_only" "${P[@]}" --gpus=0 --server_num=1 --trainer_num=1 "${W[@]}"
expect_bad "--nproc_per_node $ps_only" "${P[@]}" --nproc_per_node=2 --server_num=1 --trainer_num=1 \
  "${W[@]}"
expect_bad "--master $ps_only" "${P[@]}" --master=127.0.0.1:1 --server_num=1 --trainer_num=1 \
  "${W[@]}"
expect_bad "--trainer_num=0: ps mode needs at least 1 trainer" \
  "${P[@]}" --server_num=1 --trainer_num=0 "${W[@]}"
expect_bad "--run_mode=ps needs at least 1 server and 1 trainer" "${P[@]}" --trainer_num=1 "${W[@]}"
expect_bad "this host is not in --servers=10.231.99.1:$port --trainers=10.231.99.2 (local addresses: 127.0.0.1" \
  "${P[@]}" --servers=10.231.99.1:$port --trainers=10.231.99.2 "${W[@]}"
expect_bad "program '$marker-missing' not found in PATH" \
  "${P[@]}" --server_num=1 --trainer_num=1 "$marker-missing"

echo "== cluster files"
expect_bad "--hostfile=$work/missing: cannot open the file" --hostfile="$work/missing" "${W[@]}"
printf '127.0.0.1 slots=2\n127.0.0.2 slot=2\n' >"$work/hosts"
expect_bad "hostfile $work/hosts line 2: unknown field 'slot=2' (expected 'host slots=N')" \
  --hostfile="$work/hosts" "${W[@]}"
printf '# nothing\n\n' >"$work/empty_hosts"
expect_bad "hostfile $work/empty_hosts lists no hosts" --hostfile="$work/empty_hosts" "${W[@]}"
printf '127.0.0.1 slots=1\n' >"$work/ok_hosts"
expect_bad "--ips and --hostfile both describe the cluster" --ips=127.0.0.1 \
  --hostfile="$work/ok_hosts" "${W[@]}"
printf '{"server_list": [' >"$work/broken.json"
expect_bad "rank table $work/broken.json: not valid JSON" --rank_table="$work/broken.json" "${W[@]}"
printf '{"server_list": [{"server_id": "127.0.0.1", "device": [{"device_id": "0", "rank_id": "1"}]}]}' \
  >"$work/gap.json"
expect_bad "rank_id values must be 0..0 (one per device); rank 0 is missing" \
  --rank_table="$work/gap.json" "${W[@]}"
expect_bad "--gpus cannot be combined with --rank_table" --rank_table="$work/gap.json" --gpus=0 \
  "${W[@]}"

echo "== ports already in use"
# The listener's command line must not carry $marker: the checks look for started workers.
"$worker" listen=127.0.0.1:$((port + 1)) sleep=30 >"$work/listener" 2>&1 &
listener=$!
wait_for_text "$work/listener" "listening on" 10 || fail "the listener did not start"
expect_bad "port $((port + 1)) on 127.0.0.1 (endpoint of rank 1) is not free: Address already in use" \
  --nproc_per_node=2 "${W[@]}"
# With one process the store takes port+1: the launcher checks it on rank 0's node as well.
expect_bad "port $((port + 1)) on 127.0.0.1 (the store's endpoint, DPAR_MASTER) is not free" \
  --nproc_per_node=1 "$worker" sleep=0
expect_bad "port $((port + 1)) on 127.0.0.1 (endpoint of server 1) is not free: Address already in use" \
  --run_mode=ps --server_num=2 --trainer_num=1 "${W[@]}"
kill $listener
wait $listener 2>/dev/null

echo "== help"
# -h and --help print the usage on stdout and exit 0 without starting anything (the fuzz target
# leaves these command lines out because they exit by design).
for flag in -h --help; do
  "$launcher" "$flag" "${W[@]}" >"$work/out" 2>"$work/err"
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "^usage: dpar-launch" "$work/out" || [ -s "$work/err" ]; then
    fail "dpar-launch $flag -> exit $rc (want 0 and the usage on stdout)"
  elif pgrep -f -- "$marker" >/dev/null; then
    fail "dpar-launch $flag started something"
  else
    ok "$flag prints the usage and exits 0"
  fi
done
finish
