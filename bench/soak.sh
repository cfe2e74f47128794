#!/usr/bin/env bash
# Soak: 2 ranks train MobileNetV3-small on tiny images (32 px, batch 4, 80 training images, so
# an epoch is 10 steps and every epoch also restarts the data loader and evaluates) through
# dpar-launch for STEPS steps (default 20000), while this script samples each rank's resident
# memory and open file descriptors once a second. Prints the figures after the first 1,000
# steps and at the end, and fails when a rank's memory at the end is more than 5 % above its
# memory after 1,000 steps or its descriptor count grew.
#   bench/soak.sh [steps]        environment: DPAR_BUILD_DIR (default build), DPAR_SOAK_OUT
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20000}
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 2000 ] || {
  echo "soak.sh: steps must be a whole number >= 2000, not '$steps'" >&2
  exit 2
}
build=${DPAR_BUILD_DIR:-build}
out=${DPAR_SOAK_OUT:-$(mktemp -d)}
mkdir -p "$out"
launch=$build/launch/dpar-launch
train=$build/examples/mobilenetv3/train
for f in "$launch" "$train"; do
  [ -x "$f" ] || { echo "soak.sh: $f is not built (cmake --build $build)" >&2; exit 2; }
done

steps_per_epoch=10
epochs=$(((steps + steps_per_epoch - 1) / steps_per_epoch))
echo "soak: 2 ranks x $epochs epochs x $steps_per_epoch steps = $((epochs * steps_per_epoch)) steps; logs in $out"
"$launch" --nproc_per_node=2 --log_dir="$out/log" "$train" --epochs "$epochs" --batch-size 4 \
  --limit-train 80 --limit-val 8 --img-size 32 --threads 1 --workers 1 \
  --print-freq "$steps_per_epoch" --export=false >"$out/launch.log" 2>&1 &
launcher=$!
trap 'kill "$launcher" 2>/dev/null || true' EXIT  # the job never outlives the script

# A rank's RSS (KiB) and descriptor count, read from /proc.
sample() { # pid
  local rss fds
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0)
  fds=$(ls "/proc/$1/fd" 2>/dev/null | wc -l)
  echo "$rss $fds"
}
ranks=()
at_1000=()
last=()
while kill -0 "$launcher" 2>/dev/null; do
  sleep 1
  [ ${#ranks[@]} -eq 2 ] || mapfile -t ranks < <(pgrep -P "$launcher" -f "$train" | sort -n || true)
  [ ${#ranks[@]} -eq 2 ] || continue
  epoch=$({ grep -o '^\[Epoch [0-9]*, iter' "$out/log/workerlog.0" 2>/dev/null || true; } | tail -1 | tr -dc '0-9')
  now=("$(sample "${ranks[0]}")" "$(sample "${ranks[1]}")")
  [[ "${now[0]}" == 0* || "${now[1]}" == 0* ]] && continue  # a rank is exiting
  last=("${now[@]}")
  if [ ${#at_1000[@]} -eq 0 ] && [ -n "$epoch" ] && [ $(((epoch + 1) * steps_per_epoch)) -ge 1000 ]; then
    at_1000=("${now[@]}")
    echo "soak: after 1,000 steps: rank 0 ${at_1000[0]% *} KiB / ${at_1000[0]#* } fds, rank 1 ${at_1000[1]% *} KiB / ${at_1000[1]#* } fds"
  fi
done
wait "$launcher" || { echo "soak.sh: training failed (see $out/launch.log)" >&2; exit 1; }
[ ${#at_1000[@]} -eq 2 ] || { echo "soak.sh: never saw step 1,000" >&2; exit 1; }
echo "soak: at the end ($((epochs * steps_per_epoch)) steps): rank 0 ${last[0]% *} KiB / ${last[0]#* } fds, rank 1 ${last[1]% *} KiB / ${last[1]#* } fds"
status=0
for r in 0 1; do
  read -r rss0 fds0 <<<"${at_1000[$r]}"
  read -r rss1 fds1 <<<"${last[$r]}"
  growth=$(awk -v a="$rss0" -v b="$rss1" 'BEGIN {printf "%.2f", (b - a) * 100 / a}')
  echo "soak: rank $r resident memory ${growth} % from step 1,000 to the end, descriptors $fds0 -> $fds1"
  awk -v g="$growth" 'BEGIN {exit !(g <= 5)}' || { echo "soak.sh: rank $r memory grew more than 5 %" >&2; status=1; }
  [ "$fds1" -le "$fds0" ] || { echo "soak.sh: rank $r descriptors grew" >&2; status=1; }
done
exit $status
