#!/usr/bin/env bash
# Elastic jobs (dpar-launch --nnodes=MIN:MAX, dist::ElasticJob): three launchers on loopback
# are three nodes of one job, one process each, meeting at a rendezvous store that the first
# launcher hosts (the dpar backend).
#   elastic_cases.sh <case> <dpar-launch> <elastic_worker>
# Cases:
#   kill     one node's process (rank 2 of round 0) is SIGKILLed as its 6th step starts: the
#            other two go on as a world of 2, keep their processes, lose no step, and end
#            bitwise equal to the planned schedule (that node leaving on purpose after its 5th
#            step), which the case runs first; together the committed steps trained on the
#            epoch's first samples, each once.
#   kill_global  the same keeping the global batch (gradient accumulation) instead of the
#            per-rank batch.
#   stop     the same with that process SIGSTOPped (no connection closes): found by its
#            missing heartbeats within DPAR_ELASTIC_DETECT; bitwise equal to the schedule too.
#   rejoin   one node's process is killed and its launcher restarts it (--max_restarts=1): it
#            joins the running job, the world goes back to 3 without a survivor restarting, and
#            every member ends with the same state checksum.
#   below_min  one node of --nnodes=2:3: waits --elastic_timeout, then fails with one line
#            saying how many members it had and needed.
set -u
case_name=$1
launcher=$2
worker=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../launch/common.sh" "$launcher" "$worker"

# Under a sanitizer (tests/sanitizers/options.sh exports its options) everything runs several
# times slower: the waits and the rendezvous times grow, and the recovery time is reported
# rather than held to 10 s.
slow=1
[ -n "${TSAN_OPTIONS:-}${ASAN_OPTIONS:-}" ] && slow=10
export DPAR_ELASTIC_SETTLE=$slow DPAR_ELASTIC_DETECT=$((3 * slow)) DPAR_TIMEOUT=$((120 * slow))
rdzv=127.0.0.1:$port

# node <name> <run> [launcher flags...] -- [worker flags...]: one node's launcher in the
# background; its output goes to $work/<run>/<name>.out, its workers' logs to $work/<run>/<name>.
node() {
  local name=$1 run=$2
  shift 2
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$work/$run"
  "$launcher" --nnodes=2:3 --rdzv_endpoint="$rdzv" --rdzv_id="job-$run" --elastic_timeout=20 \
    --log_dir="$work/$run/$name" "${flags[@]}" "$worker" --init-seed="$(printf '%d' "'$name")" \
    --trace="$work/$run/$name.trace" "$@" "$marker" \
    >"$work/$run/$name.out" 2>&1 &
  eval "pid_${run}_${name}=$!"
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
  node a ref -- --leave "$@"
  sleep 0.5 # a hosts the store: the others find it up (they would retry anyway)
  node b ref -- --leave "$@"
  node c ref -- --leave "$@"
  wait_all ref 90 a b c
  reference_sum=$(checksum_of ref a)
  [ -n "$reference_sum" ] && ok "reference run finished (checksum $reference_sum)" ||
    { fail "the reference run did not finish"; cat "$work"/ref/*.out "$work"/ref/*/workerlog.0; }
  expect_text "$work/ref/$(drilled ref)/workerlog.0" "elastic_worker: left at step 5"
}

# survivors_match <run> <steps>: the two survivors finished all steps as a world of 2, with the
# reference's state.
survivors_match() {
  local run=$1 steps=$2 name
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
  node a kill -- --kill --steps "$steps" "$@"
  sleep 0.5
  node b kill -- --kill --steps "$steps" "$@"
  node c kill -- --kill --steps "$steps" "$@"
  wait_all kill 90 a b c
  survivors_match kill "$steps"
  samples_once ref
  samples_once kill
  victim=$(drilled kill)
  [ "$(eval echo "\${code_kill_${victim}:-0}")" != 0 ] &&
    ok "node $victim's launcher reported its killed process" ||
    fail "node $victim's launcher exited 0 after its process was killed"
}

case $case_name in
  kill)
    kill_case 12
    seconds=$(detection_seconds kill)
    ok "round 1 formed ${seconds:-?} s after the last commit"
    [ $slow = 1 ] || seconds=0 # timed only without a sanitizer
    awk -v s="${seconds:-99}" 'BEGIN { exit !(s < 10) }' && ok "recovered within 10 s" ||
      fail "recovery took ${seconds:-?} s (limit 10 s)"
    expect_no_job_processes ;;
  kill_global)
    # The global batch kept (12) through gradient accumulation: 2 micro-batches of 3 per rank
    # once the world is 2; 9 steps stay within the epoch of 120 samples.
    kill_case 9 --policy=global
    expect_text "$work/kill/a/workerlog.0" "elastic_worker: round 1: rank"
    expect_no_job_processes ;;
  stop)
    reference
    node a stop -- --stop
    sleep 0.5
    node b stop -- --stop
    node c stop -- --stop
    sleep $((3 * slow))
    victim=$(drilled stop)
    wait_all stop 90 $(survivors stop)
    # The victim's process is stopped for good: its launcher waits for it until the test ends it.
    pkill -KILL -f -- "$marker" 2>/dev/null
    survivors_match stop 12
    samples_once stop
    # Whichever survivor noticed first says so (the other then finds the round asked for).
    cat "$work"/stop/[abc]/workerlog.0 >"$work/stop/all.txt"
    expect_text "$work/stop/all.txt" "sent no heartbeat for $((3 * slow))"
    seconds=$(detection_seconds stop)
    ok "round 1 formed ${seconds:-?} s after the last commit"
    [ $slow = 1 ] || seconds=0 # timed only without a sanitizer
    awk -v s="${seconds:-99}" 'BEGIN { exit !(s < 10) }' && ok "detected and recovered within 10 s" ||
      fail "recovery took ${seconds:-?} s (limit 10 s)" ;;
  rejoin)
    # Each launcher may restart its process once; the drill kills one (rank 2 of round 0).
    node a rejoin --max_restarts=1 -- --kill --steps 30 --step-ms 100
    sleep 0.5
    node b rejoin --max_restarts=1 -- --kill --steps 30 --step-ms 100
    node c rejoin --max_restarts=1 -- --kill --steps 30 --step-ms 100
    wait_all rejoin 120 a b c
    sums=""
    for name in a b c; do
      line=$(finished_line rejoin "$name")
      case "$line" in
        *"step=30 world=3"*) ok "rejoin: node $name: $line" ;;
        *) fail "rejoin: node $name ended with '$line', expected step=30 world=3"
           sed 's/^/    /' "$work/rejoin/$name/workerlog.0" ;;
      esac
      sums="$sums $(checksum_of rejoin "$name")"
    done
    [ "$(echo $sums | tr ' ' '\n' | sort -u | wc -l)" = 1 ] && ok "every member holds the same state ($sums)" ||
      fail "the members' states differ:$sums"
    for name in $(survivors rejoin); do
      # A later round of 3: the restarted process joined (with or without a round of 2 between).
      grep -q "elastic_worker: round [1-9][0-9]*: rank [0-2] of 3" "$work/rejoin/$name/workerlog.0" &&
        ok "rejoin: node $name went back to a world of 3" || fail "rejoin: node $name never saw the world of 3 again"
      [ "$(grep -c "elastic_worker: round 0:" "$work/rejoin/$name/workerlog.0")" = 1 ] &&
        ok "rejoin: node $name's process never restarted" || fail "rejoin: node $name restarted"
    done
    expect_text "$work/rejoin/$(drilled rejoin).out" "restart" ;;
  below_min)
    start=$SECONDS
    "$launcher" --nnodes=2:3 --rdzv_endpoint="$rdzv" --rdzv_id=job-min --elastic_timeout=2 \
      --log_dir="$work/min" "$worker" "$marker" >"$work/min.out" 2>&1
    code=$?
    [ $code -ne 0 ] && ok "launcher exited $code" || fail "a job below its minimum exited 0"
    [ $((SECONDS - start)) -lt $((30 * slow)) ] && ok "gave up after $((SECONDS - start)) s" || fail "took $((SECONDS - start)) s"
    expect_text "$work/min/workerlog.0" "elastic: round 0 has 1 of the 2 members it needs (DPAR_ELASTIC_MIN=2, at most 3) after waiting 2 s (DPAR_ELASTIC_TIMEOUT)" ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
exit $((failures > 0))
