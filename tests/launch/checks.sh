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

# expect_no_partial_set <dir> <ranks>: after a rank was killed while an optimizer shard set
# <dir> was saved, the set is never partial. The dying rank kills itself as its own file is
# written, before its part of the index exchange, so normally no <dir> exists and <dir>.tmp is
# left behind; on a loaded machine the kill can land after rank 0 finished the set, and then
# <dir> must be whole (its index and every rank's file).
expect_no_partial_set() {
  local dir=$1 ranks=$2 r whole=1
  if [ ! -d "$dir" ]; then
    ok "no $(basename "$dir")"
    [ -d "$dir.tmp" ] && ok "$(basename "$dir").tmp left behind" || fail "no $(basename "$dir").tmp"
    return
  fi
  [ -f "$dir/index.json" ] || whole=0
  for ((r = 0; r < ranks; r++)); do [ -f "$dir/rank-$r-of-$ranks.safetensors" ] || whole=0; done
  [ $whole -eq 1 ] && ok "$(basename "$dir") was finished before the kill landed, and is whole" ||
    fail "$(basename "$dir") exists but is partial: $(ls "$dir" | tr '\n' ' ')"
}

finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}
