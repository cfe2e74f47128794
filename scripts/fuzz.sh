#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz, built with Clang under ASan + UBSan (-DDPAR_FUZZ=ON).
#   scripts/fuzz.sh [target|all] [seconds]     default: all, 600 s each
# Each target first re-runs its kept regression inputs (tests/fuzz/regressions/<target>), then
# fuzzes from those, the seed corpus (fuzz_make_seeds: files dpar's writers make) and what earlier
# runs found (<build>/corpus/<target>). A crash, leak, sanitizer report, an input running over
# 10 s or a process over 2 GiB stops the target; its input lands in <build>/artifacts/<target>/
# (copy it into tests/fuzz/regressions/<target>/ with the fix). Prints one line per target:
# executions, edges covered, result. Environment: DPAR_BUILD_DIR (default build; the fuzz build
# is <build>-fuzz), DPAR_JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-all}
seconds=${2:-600}
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: seconds must be a whole number, not '$seconds'" >&2; exit 2; }

scripts/bootstrap.sh
build=${DPAR_BUILD_DIR:-build}-fuzz
jobs=${DPAR_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

targets=$(cat tests/fuzz/targets.txt)
if [ "$target" != all ]; then
  grep -qx "$target" <<<"$targets" || { echo "fuzz.sh: no fuzz target '$target' (targets: $(echo $targets))" >&2; exit 2; }
  targets=$target
fi

echo "== configure + build ($build, clang, DPAR_FUZZ=ON)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DDPAR_WITH_CUDA=OFF -DDPAR_BUILD_TESTS=OFF -DDPAR_BUILD_BENCH=OFF \
  -DDPAR_BUILD_EXAMPLES=OFF -DDPAR_FUZZ=ON >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_make_seeds $targets

source tests/sanitizers/options.sh
# libFuzzer checks leaks itself after every input; UBSan's reports abort so they count.
export ASAN_OPTIONS=$ASAN_OPTIONS:allocator_may_return_null=1
# Seeds are made afresh for each session, in a folder of its own (sessions may run side by side).
seeds=$(mktemp -d "$build/seeds.XXXXXX")
trap 'rm -rf "$seeds"' EXIT
"$build/tests/fuzz/fuzz_make_seeds" "$seeds" >/dev/null

# Runs one target. A target that ends normally removes its scratch folder (fuzz_util.h's
# scratch_dir, named by its pid, on /dev/shm or in the temporary directory); one still there is
# added to left_behind. A TERM to this script (a cancelled CI run) stops the target too.
run_target() {
  local name=$1 pid rc=0 dir
  local -a here=()
  shift
  "$build/tests/fuzz/$name" "$@" &
  pid=$!
  trap 'kill "$pid" 2>/dev/null; exit 143' TERM
  wait "$pid" || rc=$?
  trap - TERM
  for dir in /dev/shm "${TMPDIR:-${TMP:-${TEMP:-${TEMPDIR:-/tmp}}}}"; do
    [ -e "$dir/dpar-fuzz-$pid" ] && here+=("$dir/dpar-fuzz-$pid")
  done
  # A crash (a finding) may leave it; that is the finding's report, not a second one.
  if [ "$rc" -eq 0 ]; then left_behind+=("${here[@]}"); else rm -rf "${here[@]}"; fi
  return "$rc"
}

failed=0
printf '%-20s %12s %8s  %s\n' target executions edges result
for t in $targets; do
  corpus=$build/corpus/$t
  artifacts=$build/artifacts/$t
  regressions=tests/fuzz/regressions/$t
  mkdir -p "$corpus" "$artifacts" "$seeds/$t"
  dict=()
  [ -f "tests/fuzz/dict/$t.dict" ] && dict=(-dict="tests/fuzz/dict/$t.dict")
  log=$build/$t.log
  limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=65536 -print_final_stats=1)
  inputs=("$corpus" "$seeds/$t")
  [ -d "$regressions" ] && inputs+=("$regressions")
  result=ok
  left_behind=()
  if [ -d "$regressions" ] && ! run_target "$t" "${limits[@]}" "$regressions"/* >"$log.regressions" 2>&1; then
    result="REGRESSION (see $log.regressions)"
  elif ! run_target "$t" "${limits[@]}" "${dict[@]}" -max_total_time="$seconds" \
      -artifact_prefix="$artifacts/" "${inputs[@]}" >"$log" 2>&1; then
    result="FINDING: $(ls -t "$artifacts" | head -1) (see $log)"
  fi
  if [ ${#left_behind[@]} -gt 0 ]; then
    [ "$result" = ok ] && result="LEFT BEHIND: ${left_behind[*]} (removed)"
    rm -rf "${left_behind[@]}"
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" 2>/dev/null | tail -1)
  edges=$(grep -o 'cov: [0-9]*' "$log" 2>/dev/null | tail -1 | cut -d' ' -f2)
  printf '%-20s %12s %8s  %s\n' "$t" "${execs:--}" "${edges:--}" "$result"
  [ "$result" = ok ] || failed=1
done
exit $failed
