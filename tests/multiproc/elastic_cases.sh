#!/usr/bin/env bash
# Elastic jobs (dpar-launch --nnodes=MIN:MAX, dist::ElasticJob): three launchers on loopback
# are three nodes of one job, one process each, meeting at a rendezvous store that the first
# launcher hosts (the dpar backend), or in etcd (the etcd_ cases).
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
#   kill_connecting  rank 2 of round 0 is SIGKILLed as soon as the round formed, while the
#            other two connect the round's group to it: they find it by its missing heartbeat
#            (the connect is cancelled, not waited out to DPAR_TIMEOUT) and finish as a world of 2.
#   join_stopped  rank 2 of round 0 is killed and its launcher restarts it; the restarted
#            process SIGSTOPs itself as the round it joins forms, before the state reaches it: the
#            other two drop it (no heartbeat) instead of waiting, and finish as a world of 2.
#   below_min  one node of --nnodes=2:3: waits --elastic_timeout, then fails with one line
#            saying how many members it had and needed.
#   etcd_<case>  the case with --rdzv_backend=etcd: an etcd member on loopback (started here)
#            holds the rendezvous, and heartbeats are etcd leases (stop: the stopped process's
#            lease runs out).
set -u
case_name=$1
launcher=$2
worker=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../launch/common.sh" "$launcher" "$worker"
etcd=$([ "${case_name#etcd_}" != "$case_name" ] && echo 1 || echo 0)
# The etcd cases: one etcd member on loopback holds the rendezvous; no launcher hosts a store.
[ $etcd = 1 ] && rdzv_flags=(--rdzv_backend=etcd --rdzv_endpoint="127.0.0.1:$((port + 10))")
source "$here/elastic_common.sh"
if [ $etcd = 1 ]; then
  start_etcd a 127.0.0.1 $((port + 10)) $((port + 11)) "a=http://127.0.0.1:$((port + 11))"
  etcd_ready a "127.0.0.1:$((port + 10))" || exit 1
  case_name=${case_name#etcd_}
fi

case $case_name in
  kill)
    kill_case 12
    # The survivors' failed all-reduce names the closed connection, without the hint meant for
    # a rank that skipped backward (that one times out).
    for name in $(survivors kill); do
      expect_text "$work/kill/$name/workerlog.0" "in backward failed: allreduce("
      expect_no_text "$work/kill/$name/workerlog.0" "every rank must run backward"
    done
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
    start_nodes stop -- --stop
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
    start_nodes rejoin --max_restarts=1 -- --kill --steps 30 --step-ms 100
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
  kill_connecting)
    start=$SECONDS
    start_nodes connecting -- --kill-connecting --steps 6
    wait_all connecting 90 a b c
    victim=$(grep -l "elastic_worker: killed while round 0 connects" "$work"/connecting/[abc]/workerlog.0 |
      head -1 | xargs -r dirname | xargs -r basename)
    [ -n "$victim" ] && ok "node $victim's process died as round 0 formed" || fail "no process died while connecting"
    for name in a b c; do
      [ "$name" = "$victim" ] && continue
      finished_as_two connecting 6 "$name"
      expect_text "$work/connecting/$name/workerlog.0" "stopped connecting to the other ranks: the group was aborted"
    done
    cat "$work"/connecting/[abc]/workerlog.0 >"$work/connecting/all.txt"
    expect_text "$work/connecting/all.txt" "sent no heartbeat for $((3 * slow))"
    # DPAR_TIMEOUT is 120 s here: a connect waited out would take that long.
    [ $((SECONDS - start)) -lt $((40 * slow)) ] && ok "the job finished after $((SECONDS - start)) s" ||
      fail "the job took $((SECONDS - start)) s (a connect waited for the dead member?)" ;;
  join_stopped)
    start=$SECONDS
    start_nodes joinstop --max_restarts=1 -- --kill --stop-joining --steps 30 --step-ms 100
    for _ in $(seq $((100 * slow))); do
      [ -n "$(drilled joinstop 2>/dev/null)" ] && break
      sleep 0.2
    done
    victim=$(drilled joinstop)
    wait_all joinstop 120 $(survivors joinstop)
    # The stopped process is kept by its launcher until the test ends it.
    pkill -KILL -f -- "$marker" 2>/dev/null
    expect_text "$work/joinstop/$victim/workerlog.0" "elastic_worker: stopped as it joins"
    for name in $(survivors joinstop); do
      finished_as_two joinstop 30 "$name"
      # A round of 3 with the joiner formed, then one without it. The round of 3 is named after
      # whichever came first: the joiner's request ("join") or the survivors' report of the
      # killed member ("failure", when the all-reduce noticed the death at once: shared memory).
      grep -Eq "elastic: round [1-9][0-9]*: rank [0-2] of 3 \((join|failure)" "$work/joinstop/$name/workerlog.0" &&
        ok "join_stopped: node $name saw the joiner's round" || fail "join_stopped: node $name never saw the joiner's round"
      [ "$(grep -c "elastic_worker: round 0:" "$work/joinstop/$name/workerlog.0")" = 1 ] &&
        ok "join_stopped: node $name's process never restarted" || fail "join_stopped: node $name restarted"
    done
    cat "$work"/joinstop/[abc]/workerlog.0 >"$work/joinstop/all.txt"
    expect_text "$work/joinstop/all.txt" "sent no heartbeat for $((3 * slow))"
    [ $((SECONDS - start)) -lt $((60 * slow)) ] && ok "the job finished after $((SECONDS - start)) s" ||
      fail "the job took $((SECONDS - start)) s (DPAR_TIMEOUT is 120 s)" ;;
  below_min)
    start=$SECONDS
    "$launcher" --nnodes=2:3 "${rdzv_flags[@]}" --rdzv_id=job-min --elastic_timeout=2 \
      --log_dir="$work/min" "$worker" "$marker" >"$work/min.out" 2>&1
    code=$?
    [ $code -ne 0 ] && ok "launcher exited $code" || fail "a job below its minimum exited 0"
    [ $((SECONDS - start)) -lt $((30 * slow)) ] && ok "gave up after $((SECONDS - start)) s" || fail "took $((SECONDS - start)) s"
    expect_text "$work/min/workerlog.0" "elastic: round 0 has 1 of the 2 members it needs (DPAR_ELASTIC_MIN=2, at most 3) after waiting 2 s (DPAR_ELASTIC_TIMEOUT)" ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
exit $((failures > 0))
