#!/usr/bin/env bash
# The hierarchical allreduce across two hosts (network namespaces joined by a veth pair, as in
# tests/launch/netns_two_hosts.sh), two ranks on each:
#   1. train (MobileNetV3-small, DataParallel) runs once with shared memory on (the default) and
#      once with DPAR_SHM=0: every rank's log names its allreduce transport (DPAR_DEBUG=INFO:
#      shared memory within hosts for 2 of the 4 ring hops, TCP between them; then TCP alone),
#      every rank's losses and the final weights are bitwise equal between the two runs;
#   2. rank 1 (host a) SIGKILLs itself in the middle of training: both launchers fail, host a's
#      naming the killed rank, well within NETNS_TEST_TIMEOUT although the collective timeout
#      (DPAR_TIMEOUT) is longer, so the ranks across its hops (rank 0 through shared memory,
#      rank 2 over TCP) and the one behind them (rank 3) did not wait for it.
# Usage: netns_hierarchical.sh <dpar-launch> <train> <ddp_worker>
# Exit status: 0 passed, 1 failed, 77 skipped (no network namespaces here).
set -u
launcher=$1
train=$2
ddp=$3
netns=$(cd "$(dirname "$0")/../launch" && pwd)/netns_two_hosts.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# fail, ok, finish
source "$(dirname "$netns")/checks.sh"
export OMP_NUM_THREADS=1 DPAR_DEBUG=INFO

run() {  # run <name> [env...]: train on 2 hosts x 2 ranks, logs and weights under $work/<name>
  local name=$1
  shift
  env NETNS_TEST_TIMEOUT=${NETNS_TEST_TIMEOUT:-150} "$@" "$netns" --nproc=2 --logs-to="$work/$name" "$launcher" "$train" --limit-train 256 \
    --limit-val 32 --epochs 1 --img-size 32 --batch-size 16 --print-freq 1 --workers 0 \
    --seed 7 --threads 1 --loss-log "$work/$name.loss" --output-dir "$work/$name.weights" \
    >"$work/$name.txt" 2>&1
  local rc=$?
  if [ $rc -eq 77 ]; then
    cat "$work/$name.txt"
    exit 77
  fi
  [ $rc -eq 0 ] && ok "run $name: both hosts finished" || {
    fail "run $name exited $rc"
    cat "$work/$name.txt"
  }
}

# ---- 1. the same training through either transport --------------------------------------------
run shm
run tcp DPAR_SHM=0
transport() {  # transport <run> <host> <local rank>: the transport line of that rank's log
  sed -n 's/.*gloo\/[0-9]* rank [0-9]* of 4: collectives through \(.*\)$/\1/p' \
    "$work/$1/$2/workerlog.$3" | head -n 1
}
for host in a b; do
  for l in 0 1; do
    got=$(transport shm $host $l)
    [ "$got" = "shared memory within hosts (2 of 4 ring hops), tcp between them" ] &&
      ok "host $host rank $l: $got" || fail "host $host rank $l: shared-memory run reports '$got'"
    got=$(transport tcp $host $l)
    [ "$got" = "tcp (turned off (DPAR_SHM=0))" ] &&
      ok "host $host rank $l with DPAR_SHM=0: $got" || fail "DPAR_SHM=0 run reports '$got'"
  done
done
for r in 0 1 2 3; do
  if [ -s "$work/shm.loss.rank$r" ] && cmp -s "$work/shm.loss.rank$r" "$work/tcp.loss.rank$r"; then
    ok "rank $r: the same loss at all $(wc -l <"$work/shm.loss.rank$r") steps"
  else
    fail "rank $r: the losses differ between the transports (or are missing)"
    diff "$work/shm.loss.rank$r" "$work/tcp.loss.rank$r" 2>&1 | head -5
  fi
done
weights=mobilenet_v3_small.safetensors
if [ -s "$work/shm.weights/$weights" ] && cmp -s "$work/shm.weights/$weights" "$work/tcp.weights/$weights"; then
  ok "final weights bitwise equal"
else
  fail "final weights differ between the transports (or are missing)"
fi

# ---- 2. a rank killed mid-collective fails the job on both hosts, without waiting -------------
start=$(date +%s)
DPAR_TIMEOUT=300 NETNS_TEST_TIMEOUT=40 "$netns" --nproc=2 --expect-failure=SIGKILL \
  --logs-to="$work/kill" "$launcher" "$ddp" --steps 100000 --die-rank 1 --die-step 3 \
  >"$work/kill.txt" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
[ $rc -eq 0 ] && ok "killed rank 1: both launchers failed, host a named SIGKILL (${elapsed} s)" || {
  fail "the kill drill: $(tail -n 20 "$work/kill.txt")"
}
grep -h "killing myself" "$work/kill/a/workerlog.1" >/dev/null 2>&1 && ok "rank 1 killed itself" ||
  fail "rank 1 did not say it killed itself"
# Host b's ranks learn of it through the collective (a closed TCP hop, or the mark of the rank
# across their shared-memory hop), not from a timeout.
if seen=$(grep -hE "allreduce\(.*failed on rank [23]" "$work/kill/b/workerlog."* 2>/dev/null); then
  ok "host b's ranks failed in the collective: $(echo "$seen" | head -n 1 | cut -c1-160)"
else
  fail "no rank on host b reported the failed allreduce"
fi
finish
