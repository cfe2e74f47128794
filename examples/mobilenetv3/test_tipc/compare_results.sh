#!/usr/bin/env bash
# Checks inference logs against expected results, like PaddlePaddle's compare_results.py:
#   compare_results.sh --gt=results/<model>/<mode>_fp32.txt [--atol=1e-3] [--rtol=1e-3] LOG...
# Every `image_name: X, class_id: N, prob: P` line of each log must match the expected line of
# the same image (compared by file name, so the folder may differ): the same class id and
# |P - P_expected| <= atol + rtol * |P_expected|. Each log must hold exactly the expected
# images. Exit status 0 when all logs match, 1 otherwise (the mismatches are listed).
#   compare_results.sh --update --gt=FILE LOG
# writes FILE from LOG (one known-good run; see README.md, "Expected results").
set -euo pipefail
gt="" atol=1e-3 rtol=1e-3 update=0
logs=()
while [ $# -gt 0 ]; do
  case $1 in
    --gt=*) gt=${1#--gt=} ;;
    --gt) gt=${2:-}; shift ;;
    --atol=*) atol=${1#--atol=} ;;
    --atol) atol=${2:-}; shift ;;
    --rtol=*) rtol=${1#--rtol=} ;;
    --rtol) rtol=${2:-}; shift ;;
    --update) update=1 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compare_results.sh: error: unknown flag '$1' (see --help)" >&2; exit 2 ;;
    *) logs+=("$1") ;;
  esac
  shift
done
[ -n "$gt" ] || { echo "compare_results.sh: error: --gt=FILE is required" >&2; exit 2; }
[ ${#logs[@]} -gt 0 ] || { echo "compare_results.sh: error: no inference log given" >&2; exit 2; }
for log in "${logs[@]}"; do
  [ -f "$log" ] || { echo "compare_results.sh: error: log '$log' does not exist" >&2; exit 1; }
done

# The image lines of a file as "name<TAB>class<TAB>prob", the name without its folder.
image_lines() {
  awk '
    index($0, "image_name: ") == 1 {
      rest = substr($0, 13)
      c = index(rest, ", class_id: "); if (c == 0) next
      name = substr(rest, 1, c - 1); rest = substr(rest, c + 12)
      p = index(rest, ", prob: "); if (p == 0) next
      cls = substr(rest, 1, p - 1); prob = substr(rest, p + 8)
      e = index(prob, ","); if (e > 0) prob = substr(prob, 1, e - 1)
      n = split(name, parts, "/"); name = parts[n]
      printf "%s\t%s\t%s\n", name, cls, prob
    }' "$1"
}

if [ $update -eq 1 ]; then
  [ ${#logs[@]} -eq 1 ] || { echo "compare_results.sh: error: --update takes one log" >&2; exit 2; }
  lines=$(image_lines "${logs[0]}")
  [ -n "$lines" ] || { echo "compare_results.sh: error: ${logs[0]} has no image_name lines" >&2; exit 1; }
  mkdir -p "$(dirname "$gt")"
  {
    echo "# Expected inference results (class id and probability per image), written by"
    echo "# compare_results.sh --update from $(basename "${logs[0]}")."
    echo "# How to regenerate: examples/mobilenetv3/test_tipc/README.md, \"Expected results\"."
    awk -F'\t' '{ printf "image_name: %s, class_id: %s, prob: %s\n", $1, $2, $3 }' <<<"$lines"
  } >"$gt.tmp"
  mv "$gt.tmp" "$gt"
  echo "compare_results.sh: wrote $(wc -l <<<"$lines") expected results to $gt"
  exit 0
fi

if [ ! -f "$gt" ]; then
  echo "compare_results.sh: error: expected results '$gt' do not exist; write them from a known-good run with: compare_results.sh --update --gt=$gt <infer log>" >&2
  exit 1
fi
expected=$(image_lines "$gt")
[ -n "$expected" ] || { echo "compare_results.sh: error: $gt has no image_name lines" >&2; exit 1; }

failed=0
for log in "${logs[@]}"; do
  if ! report=$(awk -F'\t' -v atol="$atol" -v rtol="$rtol" -v logname="$log" '
      NR == FNR { cls[$1] = $2; prob[$1] = $3; want++; next }
      {
        got++
        if (!($1 in cls)) { bad++; if (bad <= 5) print "  " $1 ": not in the expected results"; next }
        if (seen[$1]++) { bad++; if (bad <= 5) print "  " $1 ": listed twice"; next }
        d = $3 - prob[$1]; if (d < 0) d = -d
        r = prob[$1] < 0 ? -prob[$1] : prob[$1]
        if (d > maxd) maxd = d
        if ($2 != cls[$1]) {
          bad++; if (bad <= 5) printf "  %s: class_id %s, expected %s\n", $1, $2, cls[$1]
        } else if (d > atol + rtol * r) {
          bad++; if (bad <= 5) printf "  %s: prob %s, expected %s (|diff| %.3g > atol %s + rtol %s * %s)\n", $1, $3, prob[$1], d, atol, rtol, prob[$1]
        }
      }
      END {
        for (k in cls) if (!(k in seen)) { bad++; if (bad <= 5) print "  " k ": missing from the log" }
        if (bad) { printf "FAIL: %s: %d of %d expected images differ\n", logname, bad, want; exit 1 }
        printf "ok: %s: %d images match (max |prob diff| %.2g)\n", logname, got, maxd
      }' <(printf '%s\n' "$expected") <(image_lines "$log")); then
    failed=1
  fi
  echo "$report"
done
if [ $failed -ne 0 ]; then
  echo "compare_results.sh: some logs differ from $gt (atol $atol, rtol $rtol)"
  exit 1
fi
echo "compare_results.sh: ${#logs[@]} log(s) match $gt (atol $atol, rtol $rtol)"
