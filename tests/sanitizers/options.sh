# Sourced by scripts/test.sh --sanitize and scripts/fuzz.sh: the runtime options of the
# sanitizers, for every process a test starts (dpar-launch passes the environment on to ranks).
# Suppressions are for third-party code only; each line in the .supp files says why.
sanitizer_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Leaks are checked at exit; a report or an ASan error fails the process with its own exit code.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:${ASAN_OPTIONS:-}
export LSAN_OPTIONS=suppressions=$sanitizer_dir/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$sanitizer_dir/ubsan.supp:${UBSAN_OPTIONS:-}
# Races are reported and the process exits 66 at the end, so one run shows every race.
export TSAN_OPTIONS=suppressions=$sanitizer_dir/tsan.supp:second_deadlock_stack=1:history_size=4:${TSAN_OPTIONS:-}
