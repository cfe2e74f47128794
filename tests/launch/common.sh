# shellcheck shell=bash
# Shared by the launcher test scripts: `source common.sh <dpar-launch> <env_worker>`.
# Gives $launcher, $worker, a scratch dir $work (removed on exit, with any process still
# carrying $marker), a free-looking port block $port, and check helpers that count failures.
launcher=$1
worker=$2
work=$(mktemp -d)
marker="dpar_launch_test_$$_${RANDOM}"
# A random block per run, so concurrent test runs do not fight over ports.
port=$((20000 + (RANDOM % 2000) * 10))
cleanup_common() {
  pkill -KILL -f -- "$marker" 2>/dev/null
  rm -rf "$work"
}
trap cleanup_common EXIT

source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
