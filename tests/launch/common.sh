# shellcheck shell=bash
# Shared by the launcher test scripts: `source common.sh <dpar-launch> <env_worker>`.
# Gives $launcher, $worker, a scratch dir $work (removed on exit, with any process still
# carrying $marker), a port block $port (20 ports no concurrent test holds, from
# tests/port_block.sh), and check helpers that count failures.
launcher=$1
worker=$2
work=$(mktemp -d)
marker="dpar_launch_test_$$_${RANDOM}"
source "$(dirname "${BASH_SOURCE[0]}")/../port_block.sh"
take_port_block || exit 1
cleanup_common() {
  pkill -KILL -f -- "$marker" 2>/dev/null
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup_common EXIT

source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
