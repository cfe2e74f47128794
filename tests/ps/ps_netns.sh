#!/usr/bin/env bash
# Parameter-server training across two hosts: two network namespaces joined by a veth pair
# (tests/launch/netns_two_hosts.sh --ps), one server and one trainer on each, the real train
# program in sync mode. Both launchers must exit 0. Exit 77 (skipped) without CAP_NET_ADMIN.
# Usage: ps_netns.sh <train> <dpar-launch> <source dir>
set -u
train=$1
launcher=$2
src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
NETNS_TEST_TIMEOUT=240 "$src/tests/launch/netns_two_hosts.sh" --ps "$launcher" "$train" \
  --limit-train 256 --limit-val 32 --img-size 32 --batch-size 32 --epochs 1 --print-freq 2 \
  --workers 1 --seed 3 --ps-mode sync --output-dir "$work/out"
rc=$?
[ $rc -eq 0 ] || exit $rc
if [ -f "$work/out/mobilenet_v3_small.safetensors" ]; then
  echo "PASS: trainer 0 (host a) wrote its weights"
  exit 0
fi
echo "FAIL: the job exited 0 but trainer 0 wrote no weights to $work/out"
exit 1
