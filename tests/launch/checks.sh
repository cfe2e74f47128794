# shellcheck shell=bash
# Check helpers shared by the launcher and parameter-server test scripts. They count failures
# in $failures; expect_no_job_processes looks for processes whose command line carries $marker.
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }

# expect_line FILE LINE: FILE has exactly that line.
expect_line() {
  if grep -qxF -- "$2" "$1"; then ok "$(basename "$1"): $2"; else fail "$1 lacks line '$2'"; fi
}
# expect_text FILE TEXT: FILE contains TEXT somewhere.
expect_text() {
  if grep -qF -- "$2" "$1"; then ok "$(basename "$1") mentions '$2'"; else
    fail "$1 lacks '$2'; it has:"
    sed 's/^/    /' "$1"
  fi
}
expect_no_text() {
  if grep -qF -- "$2" "$1"; then fail "$1 should not contain '$2'"; else ok "$(basename "$1") has no '$2'"; fi
}
# expect_no_job_processes: nothing with the marker in its command line is left.
expect_no_job_processes() {
  local left
  left=$(pgrep -f -- "$marker" || true)
  if [ -n "$left" ]; then
    fail "processes of the job remain: $(ps -o pid,stat,args -p "$(echo $left | tr ' ' ,)" | tail -n +2)"
  else
    ok "no process of the job remains"
  fi
}
# wait_for_text FILE TEXT SECONDS: waits until FILE contains TEXT.
wait_for_text() {
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -le "$deadline" ]; do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
# now_ms: milliseconds since the epoch.
now_ms() { date +%s%3N; }

# run_timed OUT ERR args...: runs the launcher, sets $rc and $elapsed_ms.
run_timed() {
  local out=$1 err=$2
  shift 2
  local t0
  t0=$(now_ms)
  "$launcher" "$@" >"$out" 2>"$err"
  rc=$?
  elapsed_ms=$(($(now_ms) - t0))
}

# expect_kill9_teardown CODE END_MS OUT LOGS...: a rank that SIGKILLed itself (printing "killing
# myself with SIGKILL ... (epoch ms T)") ended the job: the launcher exited CODE != 0 at END_MS,
# within 10 s of the kill (timed from the kill, not the launch: start-up, CUDA and NCCL set-up
# on a GPU, is not part of the teardown), saying which rank and signal, and nothing is left.
expect_kill9_teardown() {
  local code=$1 end=$2 out=$3
  shift 3
  local killed_at elapsed
  killed_at=$(cat "$out" "$@" 2>/dev/null |
    sed -n 's/.*killing myself with SIGKILL.*(epoch ms \([0-9]*\)).*/\1/p' | head -n 1)
  [ "$code" -ne 0 ] && ok "launcher exited $code" || fail "launcher exited 0 after a SIGKILLed rank"
  if [ -z "$killed_at" ]; then
    fail "the dying rank did not say when it killed itself"
  else
    elapsed=$((end - killed_at))
    [ $elapsed -lt 10000 ] && ok "torn down $elapsed ms after the kill" ||
      fail "took $elapsed ms after the kill (limit 10 s)"
  fi
  expect_text "$out" "rank 1"
  expect_text "$out" "SIGKILL"
  sleep 0.5
  expect_no_job_processes
}

# expect_no_partial_sets <dir> <ranks>: after rank 1 was killed while optimizer shard sets
# <dir>/set_b_0, set_b_1, ... were saved one after another (launch/kill_during_saves.h), every
# set under its final name is whole (its index and every rank's file); one being saved when
# the job ended stays set_b_<k>.tmp.
expect_no_partial_sets() {
  local dir=$1 ranks=$2 set r whole finished=0
  for set in "$dir"/set_b_*; do
    [ -d "$set" ] || continue
    case $set in *.tmp) continue ;; esac
    whole=1
    [ -f "$set/index.json" ] || whole=0
    for ((r = 0; r < ranks; r++)); do [ -f "$set/rank-$r-of-$ranks.safetensors" ] || whole=0; done
    [ $whole -eq 1 ] || fail "$(basename "$set") exists but is partial: $(ls "$set" | tr '\n' ' ')"
    finished=$((finished + 1))
  done
  ok "$finished set(s) finished before the kill, each whole"
  # Usually the set in progress is left as .tmp; the teardown may also have stopped rank 0
  # between one set's rename and the next set's folder, which is just as whole.
  ls -d "$dir"/set_b_*.tmp >/dev/null 2>&1 && ok "the set being saved was left as .tmp" ||
    ok "no set was in progress when the job ended"
}

finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}
