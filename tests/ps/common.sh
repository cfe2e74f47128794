# shellcheck shell=bash
# Shared by the ps test scripts: `source common.sh <train> <dpar-launch> ...`. Gives $train,
# $launcher, a scratch dir $work (removed on exit, with every process carrying $marker), a
# random port block $port, the small training recipe $recipe and the check helpers of
# tests/launch/checks.sh.
train=$1
launcher=$2
marker="dpar_ps_test_$$_${RANDOM}"
# Every path given to the programs lies under $work, so its name finds the job's processes.
work=$(mktemp -d "/tmp/$marker.XXXXXX")
source "$(dirname "${BASH_SOURCE[0]}")/../port_block.sh"
take_port_block || exit 1
export OMP_NUM_THREADS=1
# 1024 images at 32 px, batch 32 per trainer: 16 steps per epoch with 2 trainers.
recipe=(--limit-train 1024 --limit-val 64 --img-size 32 --batch-size 32 --print-freq 4
        --workers 1 --seed 3 --lr 0.1)
cleanup_common() {
  pkill -KILL -f -- "$marker" 2>/dev/null
  rm -rf "$work"
}
trap cleanup_common EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../launch/checks.sh"
