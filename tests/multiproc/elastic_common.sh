# Shared by the elastic job tests (elastic_cases.sh on loopback, elastic_netns.sh across network
# namespaces): three nodes a, b, c of one elastic job (dpar-launch --nnodes=2:3, one
# elastic_worker each), the planned-schedule reference, and the checks on survivors, samples and
# recovery time. Sourced after tests/launch/common.sh ($launcher, $worker, $work, $port, $marker,
# ok/fail/expect_text).
# Under a sanitizer (tests/sanitizers/options.sh exports its options) everything runs several
# times slower: the waits and the rendezvous times grow, and the recovery time is reported
# rather than held to 10 s.
slow=1
[ -n "${TSAN_OPTIONS:-}${ASAN_OPTIONS:-}" ] && slow=10
export DPAR_ELASTIC_SETTLE=$slow DPAR_ELASTIC_DETECT=$((3 * slow)) DPAR_TIMEOUT=$((120 * slow))
# Hooks a caller may set before sourcing: rdzv_flags (the launchers' rendezvous flags; default
# the dpar store that node a hosts on loopback), on_node NAME CMD... (how a node runs a command;
# elastic_netns.sh runs it in the node's namespace) and node_order (the order the nodes start
# in, half a second apart, which is the order they arrive in: the last is rank 2 of round 0).
if ! declare -p rdzv_flags >/dev/null 2>&1; then rdzv_flags=(--rdzv_endpoint="127.0.0.1:$port"); fi
declare -F on_node >/dev/null || on_node() { shift; "$@"; }
node_order=${node_order:-a b c}

# node <name> <run> [launcher flags...] -- [worker flags...]: one node's launcher in the
# background; its output goes to $work/<run>/<name>.out, its workers' logs to $work/<run>/<name>.
node() {
  local name=$1 run=$2
  shift 2
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$work/$run"
  on_node "$name" "$launcher" --nnodes=2:3 "${rdzv_flags[@]}" --rdzv_id="job-$run" --elastic_timeout=20 \
    --log_dir="$work/$run/$name" "${flags[@]}" "$worker" --init-seed="$(printf '%d' "'$name")" \
    --trace="$work/$run/$name.trace" "$@" "$marker" \
    >"$work/$run/$name.out" 2>&1 &
  eval "pid_${run}_${name}=$!"
}

# start_nodes <run> [launcher flags...] -- [worker flags...]: the three nodes in $node_order
# (with the dpar backend node a, which hosts the store, goes first). Each starts a moment (well
# within DPAR_ELASTIC_SETTLE) after the one before reached the rendezvous (its worker wrote
# <trace>.ready): starting a process can take seconds under a sanitizer, and the arrival order
# makes round 0's ranks, which decide whose initial weights the job trains (the reference must
# match) and whom a drill strikes.
start_nodes() {
  local run=$1 name previous=""
  shift
  for name in $node_order; do
    if [ -n "$previous" ]; then
      local deadline=$((SECONDS + 30 * slow))
      while [ ! -e "$work/$run/$previous.trace.ready" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
      [ -e "$work/$run/$previous.trace.ready" ] ||
        fail "$run: node $previous's worker did not reach the rendezvous in $((30 * slow)) s"
      sleep "$([ $slow = 1 ] && echo 0.3 || echo 2)"
    fi
    previous=$name
    node "$name" "$run" "$@"
  done
}

# wait_all <run> <seconds> <node...>: waits for those launchers; says which exited non-zero.
wait_all() {
  local run=$1 limit=$(($2 * slow)) name pid code
  shift 2
  for name in "$@"; do
    pid=$(eval echo "\$pid_${run}_${name}")
    local deadline=$((SECONDS + limit))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      fail "$run: node $name still runs after $limit s"
      kill -KILL "$pid" 2>/dev/null
      continue
    fi
    wait "$pid"
    code=$?
    eval "code_${run}_${name}=$code"
  done
}

finished_line() {  # finished_line <run> <node>: the worker's "finished" line, without noise
  grep -h "elastic_worker: finished" "$work/$1/$2/workerlog.0" 2>/dev/null | tail -1
}
checksum_of() { finished_line "$1" "$2" | sed -n 's/.*checksum=\([0-9a-f]*\).*/\1/p'; }

# drilled <run>: the node whose process was rank 2 in round 0 (b or c, whichever arrived last),
# which the drills strike; survivors <run>: the other two.
drilled() { grep -l "elastic_worker: round 0: rank 2 of 3" "$work/$1"/[abc]/workerlog.0 | head -1 | xargs dirname | xargs basename; }
survivors() { local d; d=$(drilled "$1"); for n in a b c; do [ "$n" != "$d" ] && echo "$n"; done; }

# samples_once <run>: the committed steps of every node together trained on the first samples of
# the epoch's order, each once (none skipped, none seen twice, across the change of world size).
samples_once() {
  local verdict
  verdict=$(/usr/bin/python3 - "$work/$1" <<'PY'
import glob, sys
order, seen = None, []
for path in glob.glob(sys.argv[1] + "/*.trace"):
    for line in open(path):
        words = line.split()
        if words[0] == "order":
            order = [int(w) for w in words[1:]]
        else:
            seen += [int(w) for w in words[2:]]
twice = len(seen) - len(set(seen))
if order is None:
    print("no epoch order in the traces")
elif twice or sorted(seen) != sorted(order[:len(seen)]):
    print(f"{len(seen)} samples trained, {twice} twice, not the epoch's first {len(seen)}")
else:
    print(f"ok {len(seen)}")
PY
)
  case "$verdict" in
    ok*) ok "$1: the committed steps trained on the epoch's first ${verdict#ok } samples, each once" ;;
    *) fail "$1: $verdict" ;;
  esac
}

# The planned schedule: rank 2 leaves on purpose after step 5 (the failure drills strike as step
# 6 starts, with 5 committed). Worker flags: "$@".
reference() {
  start_nodes ref -- --leave "$@"
  wait_all ref 90 a b c
  reference_sum=$(checksum_of ref "$(survivors ref | head -1)")
  [ -n "$reference_sum" ] && ok "reference run finished (checksum $reference_sum)" ||
    { fail "the reference run did not finish"; cat "$work"/ref/*.out "$work"/ref/*/workerlog.0; }
  expect_text "$work/ref/$(drilled ref)/workerlog.0" "elastic_worker: left at step 5"
}

# survivors_match <run> <steps>: the two survivors finished all steps as a world of 2, with the
# reference's state.
survivors_match() {
  local run=$1 steps=$2 name
  [ -n "$reference_sum" ] || { fail "$run: no reference checksum to compare with"; return; }
  for name in $(survivors "$run"); do
    local line
    line=$(finished_line "$run" "$name")
    case "$line" in
      *"step=$steps world=2 checksum=$reference_sum"*) ok "$run: node $name: $line (= the planned schedule)" ;;
      *) fail "$run: node $name ended with '$line', expected step=$steps world=2 checksum=$reference_sum"
         sed 's/^/    /' "$work/$run/$name/workerlog.0" ;;
    esac
    # One process all along: its log shows both rounds (a restart would start a new log).
    expect_text "$work/$run/$name/workerlog.0" "elastic_worker: round 0: rank"
    expect_text "$work/$run/$name/workerlog.0" "elastic_worker: round 1: rank"
    [ "$(eval echo "\${code_${run}_${name}:-x}")" = 0 ] && ok "$run: node $name's launcher exited 0" ||
      fail "$run: node $name's launcher exited $(eval echo "\${code_${run}_${name}:-?}")"
  done
}

# finished_as_two <run> <steps> <node...>: those nodes finished all steps as a world of 2.
finished_as_two() {
  local run=$1 steps=$2 name line
  shift 2
  for name in "$@"; do
    line=$(finished_line "$run" "$name")
    case "$line" in
      *"step=$steps world=2"*) ok "$run: node $name: $line" ;;
      *) fail "$run: node $name ended with '$line', expected step=$steps world=2"
         sed 's/^/    /' "$work/$run/$name/workerlog.0" ;;
    esac
  done
}

# detection_seconds <run>: from node a's log, the time between its last commit and round 1.
detection_seconds() {
  grep -h "elastic_worker: round 1:" "$work/$1/$(survivors "$1" | head -1)/workerlog.0" | sed -n 's/.*(\([0-9.]*\) s after the last commit).*/\1/p'
}

# kill_case <steps> <worker flags...>: the planned schedule, then the same job losing rank 2 to
# SIGKILL at the same step.
kill_case() {
  local steps=$1
  shift
  reference --steps "$steps" "$@"
  start_nodes kill -- --kill --steps "$steps" "$@"
  wait_all kill 90 a b c
  survivors_match kill "$steps"
  samples_once ref
  samples_once kill
  victim=$(drilled kill)
  [ "$(eval echo "\${code_kill_${victim}:-0}")" != 0 ] &&
    ok "node $victim's launcher reported its killed process" ||
    fail "node $victim's launcher exited 0 after its process was killed"
}


# start_etcd <name> <ip> <client port> <peer port> <initial cluster>: one etcd member (Debian's
# etcd-server) in the background, run by on_node <name>; its data and log under $work (the data
# folder carries $marker, so the scratch clean-up ends the member too).
start_etcd() {
  local name=$1 ip=$2 cport=$3 pport=$4 cluster=$5
  on_node "$name" /usr/bin/etcd --name="$name" --data-dir="$work/etcd-$marker-$name" \
    --listen-client-urls="http://$ip:$cport" --advertise-client-urls="http://$ip:$cport" \
    --listen-peer-urls="http://$ip:$pport" --initial-advertise-peer-urls="http://$ip:$pport" \
    --initial-cluster="$cluster" --initial-cluster-state=new --initial-cluster-token="$marker" \
    --logger=zap --log-level=warn >"$work/etcd-$name.log" 2>&1 &
}

# etcd_ready <node> <endpoints>: waits (up to 30 s) until the cluster takes a write, asked from
# that node.
etcd_ready() {
  local name=$1 endpoints=$2 deadline=$((SECONDS + 30))
  while [ $SECONDS -lt $deadline ]; do
    if on_node "$name" env ETCDCTL_API=3 etcdctl --endpoints="$endpoints" --command-timeout=2s \
      put /dpar-test/ready 1 >/dev/null 2>&1; then
      ok "etcd at $endpoints is up"
      return 0
    fi
    sleep 0.3
  done
  fail "etcd at $endpoints did not come up in 30 s"
  cat "$work"/etcd-*.log
  return 1
}
