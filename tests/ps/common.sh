# shellcheck shell=bash
# Shared by the ps test scripts: `source common.sh <train> <dpar-launch> ...`. Gives $train,
# $launcher, a scratch dir $work (removed on exit, with every process carrying $marker), a
# random port block $port, the small training recipe $recipe and check helpers.
train=$1
launcher=$2
marker="dpar_ps_test_$$_${RANDOM}"
# Every path given to the programs lies under $work, so its name finds the job's processes.
work=$(mktemp -d "/tmp/$marker.XXXXXX")
port=$((30000 + (RANDOM % 1500) * 10))
failures=0
export OMP_NUM_THREADS=1
# 1024 images at 32 px, batch 32 per trainer: 16 steps per epoch with 2 trainers.
recipe=(--limit-train 1024 --limit-val 64 --img-size 32 --batch-size 32 --print-freq 4
        --workers 1 --seed 3 --lr 0.1)
cleanup_common() {
  pkill -KILL -f -- "$marker" 2>/dev/null
  rm -rf "$work"
}
trap cleanup_common EXIT
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }
expect_text() {  # FILE TEXT
  if grep -qF -- "$2" "$1"; then ok "$(basename "$1") mentions '$2'"; else
    fail "$1 lacks '$2'; it has:"
    tail -n 30 "$1" | sed 's/^/    /'
  fi
}
expect_no_job_processes() {
  local left
  left=$(pgrep -f -- "$marker" || true)
  if [ -n "$left" ]; then
    fail "processes of the job remain: $left"
  else
    ok "no process of the job remains"
  fi
}
wait_for_text() {  # FILE TEXT SECONDS
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -le "$deadline" ]; do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
finish() {
  if [ $failures -eq 0 ]; then echo "PASS"; exit 0; fi
  echo "$failures failure(s)"
  exit 1
}
