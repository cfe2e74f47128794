#!/usr/bin/env bash
# Elastic jobs across three hosts: network namespaces a, b, c (10.232.0.1..3) on one bridge, one
# dpar-launch --nnodes=2:3 and one elastic_worker each. The worker that is rank 2 of round 0
# holds at its 6th step (--hold) and the test strikes its whole node; the other two must go on as
# a world of 2 within 10 s, in the same processes, lose no step, and end bitwise equal to the
# planned schedule (rank 2 leaving on purpose after step 5), which each case runs first.
#   elastic_netns.sh <case> <dpar-launch> <elastic_worker>
# Cases:
#   etcd_kill  --rdzv_backend=etcd with an etcd member on every host; node a is made rank 2 and
#              its member the etcd leader, then every process of node a (launcher, worker, etcd
#              member) is SIGKILLed: the job loses the node that held the store's leader.
#   etcd_link  the same, but node a's link goes down (ip link set ... down): its processes live
#              on, cut off, and its member loses the quorum.
#   dpar_kill  --rdzv_backend=dpar, the store on node a (rank 0); rank 2's node (c) is killed.
#   dpar_link  the same with node c's link down.
# Exit status: 0 passed, 1 failed, 77 skipped (no CAP_NET_ADMIN, no `ip`, no etcd).
set -u
case_name=$1
launcher=$2
worker=$3
here=$(cd "$(dirname "$0")" && pwd)
skip() {
  echo "SKIPPED: $*"
  exit 77
}
command -v ip >/dev/null || skip "the 'ip' tool (iproute2) is not installed"
[ -x /usr/bin/etcd ] || skip "etcd-server is not installed (scripts/bootstrap.sh installs it)"
source "$here/../launch/common.sh" "$launcher" "$worker"

tag=$$
switch=dpar_el_sw_$tag
declare -A ip_of=([a]=10.232.0.1 [b]=10.232.0.2 [c]=10.232.0.3)
ns_of() { echo "dpar_el_$1_$tag"; }
cleanup_netns() {
  local n pid
  for n in a b c; do
    for pid in $(ip netns pids "$(ns_of $n)" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$(ns_of $n)" 2>/dev/null
  done
  ip netns del "$switch" 2>/dev/null
  cleanup_common
}
trap cleanup_netns EXIT
if ! err=$(ip netns add "$switch" 2>&1); then
  skip "cannot create a network namespace (needs root or CAP_NET_ADMIN): $err"
fi
# The bridge lives in a namespace of its own, so no interface appears in the machine's own.
setup() {
  ip -n "$switch" link add br0 type bridge && ip -n "$switch" link set br0 up || return 1
  local n
  for n in a b c; do
    ip netns add "$(ns_of $n)" &&
      ip -n "$switch" link add "port_$n" type veth peer name eth0 netns "$(ns_of $n)" &&
      ip -n "$switch" link set "port_$n" master br0 up &&
      ip -n "$(ns_of $n)" addr add "${ip_of[$n]}/24" dev eth0 &&
      ip -n "$(ns_of $n)" link set eth0 up && ip -n "$(ns_of $n)" link set lo up || return 1
  done
}
if ! err=$(setup 2>&1); then
  skip "cannot set up three namespaces on a bridge (no veth or bridge support?): $err"
fi
on_node() {
  local n=$1
  shift
  ip netns exec "$(ns_of "$n")" "$@"
}

backend=${case_name%%_*}
strike=${case_name#*_}
members=${ip_of[a]}:2379,${ip_of[b]}:2379,${ip_of[c]}:2379
if [ "$backend" = etcd ]; then
  rdzv_flags=(--rdzv_backend=etcd --rdzv_endpoint="$members")
  node_order="b c a"  # a arrives last: rank 2, the node struck
else
  rdzv_flags=(--rdzv_endpoint="${ip_of[a]}:$port")
  node_order="a b c"  # a hosts the store and is rank 0; c is rank 2
fi
source "$here/elastic_common.sh"

if [ "$backend" = etcd ]; then
  cluster=""
  for n in a b c; do cluster+="${cluster:+,}$n=http://${ip_of[$n]}:2380"; done
  for n in a b c; do start_etcd "$n" "${ip_of[$n]}" 2379 2380 "$cluster"; done
  etcd_ready b "$members" || exit 1
fi

# make_a_leader: node a's etcd member leads the cluster when the drill strikes.
make_a_leader() {
  local id
  id=$(on_node b env ETCDCTL_API=3 etcdctl --endpoints="$members" member list |
    awk -F', ' '$3 == "a" { print $1 }')
  on_node b env ETCDCTL_API=3 etcdctl --endpoints="$members" move-leader "$id" >/dev/null 2>&1
  on_node b env ETCDCTL_API=3 etcdctl --endpoints="${ip_of[a]}:2379" endpoint status |
    grep -q ", true, " && ok "node a's etcd member is the leader" ||
    fail "could not make node a's etcd member the leader"
}

reference --steps 12
[ "$backend" = etcd ] && make_a_leader
start_nodes drill -- --hold --steps 12
deadline=$((SECONDS + 60 * slow))
held=""
while [ -z "$held" ] && [ $SECONDS -lt $deadline ]; do
  held=$(ls "$work"/drill/*.trace.held 2>/dev/null | head -1)
  sleep 0.1
done
[ -n "$held" ] || { fail "no worker reached the drill step"; cat "$work"/drill/*.out; exit 1; }
victim=$(basename "$held" .trace.held)
[ "$victim" = "$(drilled drill)" ] && ok "node $victim (rank 2) holds at step 6" ||
  fail "the held worker is on node $victim, rank 2 was on $(drilled drill)"
case $strike in
  kill)
    pids=$(ip netns pids "$(ns_of "$victim")")
    kill -KILL $pids
    ok "killed every process of node $victim ($(echo $pids | wc -w) processes)" ;;
  link)
    ip -n "$(ns_of "$victim")" link set eth0 down
    ok "node $victim's link is down" ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
survivor_pids_before=$(for n in $(survivors drill); do ip netns pids "$(ns_of "$n")"; done | sort | tr '\n' ' ')
wait_all drill 90 $(survivors drill)
survivors_match drill 12
samples_once drill
seconds=$(detection_seconds drill)
ok "round 1 formed ${seconds:-?} s after the last commit"
awk -v s="${seconds:-99}" 'BEGIN { exit !(s < 10) }' && ok "detected and recovered within 10 s" ||
  fail "recovery took ${seconds:-?} s (limit 10 s)"
exit $((failures > 0))
