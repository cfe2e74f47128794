#!/usr/bin/env bash
# prepare.sh + test_train_inference.sh in lite_train_lite_infer mode for one params file: what
# CI runs (ctest tipc_lite_*), and a one-line way to run the chain by hand:
#   DPAR_BUILD_DIR=build run_lite_chain.sh configs/mobilenet_v3_small/train_infer.txt
# Exit status: test_train_inference.sh's (77: skipped, e.g. netns without CAP_NET_ADMIN).
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 <params file>" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
params=$(realpath -m -- "$1")
"$here/prepare.sh" "$params" lite_train_lite_infer || exit 1
start=$SECONDS
"$here/test_train_inference.sh" "$params" lite_train_lite_infer
rc=$?
echo "run_lite_chain.sh: $(basename "$params") lite_train_lite_infer: exit status $rc after $((SECONDS - start)) s"
exit $rc
