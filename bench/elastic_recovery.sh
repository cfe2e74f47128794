#!/usr/bin/env bash
# Recovery from a lost member, train --elastic against today's restart-from-disk path, on the
# same MobileNetV3-small job: 3 processes on loopback, one training thread each, 1 epoch of
# --limit-train images (global batch 48), rank 2 SIGKILLed after global step KILL_AT
# (DPAR_TEST_DIE_AT_STEP). Default DPAR_ELASTIC_SETTLE / DPAR_ELASTIC_DETECT.
#   elastic   three elastic launchers (--nnodes=2:3); the survivors go on as 2 from the commit;
#   restart   one launcher --nproc_per_node=3 --max_restarts=1, checkpoints every
#             CHECKPOINT_EVERY steps, --resume auto: every process restarts from the last
#             checkpoint (the steps since it are trained again).
# Reported per path: the gap in rank 0's log between the last step before the failure and the
# first one after it (console lines time-stamped here), the steps trained again, and the job's
# wall time; then restart / elastic.
#   bench/elastic_recovery.sh [build dir]   (KILL_AT=13 CHECKPOINT_EVERY=5 LIMIT_TRAIN=960)
set -u
build=${1:-build}
launcher=$build/launch/dpar-launch
train=$build/examples/mobilenetv3/train
kill_at=${KILL_AT:-13}
every=${CHECKPOINT_EVERY:-5}
limit=${LIMIT_TRAIN:-960}
work=$(mktemp -d)
trap 'pkill -KILL -f -- "$work" 2>/dev/null; rm -rf "$work"' EXIT
common=(--epochs 1 --limit-train "$limit" --limit-val 64 --batch-size 16 --img-size 32
  --print-freq 1 --workers 0 --threads 1)
port=$((20000 + RANDOM % 20000))

# stamp FILE: each input line prefixed with the seconds since the epoch.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$1"; }

# gap FILE: seconds between rank 0's log line of step KILL_AT and its next step line after the
# failure (the first step of the recovered job), and that step's number.
gap() {
  /usr/bin/python3 - "$1" "$kill_at" <<'PY'
import re, sys
lines = [l.split(" ", 1) for l in open(sys.argv[1])]
# Rank 0's own step lines (the launcher also quotes a dead rank's last lines, indented).
train = [(float(t), l) for t, l in lines if re.match(r"\[Epoch \d+, iter: \d+\]", l)]
kill_at = int(sys.argv[2])
before = after = None
for i, (t, l) in enumerate(train):
    if before is None and "iter: %d]" % kill_at in l:
        before = i
    elif before is not None and i > before:
        after = i
        break
if before is None or after is None:
    print("? ?")
else:
    step = int(re.search(r"iter: (\d+)\]", train[after][1]).group(1))
    print("%.2f %d" % (train[after][0] - train[before][0], step))
PY
}

t0=$(date +%s.%N)
for name in a b c; do
  DPAR_TEST_DIE_AT_STEP=$kill_at:2 "$launcher" --nnodes=2:3 --rdzv_endpoint="127.0.0.1:$port" \
    --rdzv_id=recovery --log_dir="$work/elastic_$name" "$train" --elastic "${common[@]}" \
    2>&1 | { [ $name = a ] && stamp "$work/elastic.log" || cat >/dev/null; } &
  sleep 0.5
done
wait
t1=$(date +%s.%N)
DPAR_TEST_DIE_AT_STEP=$kill_at:2 "$launcher" --nproc_per_node=3 --max_restarts=1 \
  --start_port=$((port + 10)) --log_dir="$work/restart" "$train" "${common[@]}" \
  --checkpoint-dir="$work/ckpt" --step-interval="$every" --resume=auto 2>&1 | stamp "$work/restart.log"
t2=$(date +%s.%N)

read -r elastic_gap elastic_next < <(gap "$work/elastic.log")
read -r restart_gap restart_next < <(gap "$work/restart.log")
echo "job: MobileNetV3-small, 3 processes x 1 thread, $limit images, global batch 48, rank 2 killed after step $kill_at"
printf 'elastic  (train --elastic)                  : %s s from step %d to the next step (%s), steps trained again: %s, job %.1f s\n' \
  "$elastic_gap" "$kill_at" "step $elastic_next" "$((elastic_next - kill_at - 1))" "$(echo "$t1 - $t0" | bc)"
printf 'restart  (--max_restarts, checkpoint every %d): %s s from step %d to the next step (%s), steps trained again: %s, job %.1f s\n' \
  "$every" "$restart_gap" "$kill_at" "step $restart_next" "$((kill_at + 1 - restart_next))" "$(echo "$t2 - $t1" | bc)"
echo "recovery gap ratio (restart / elastic): $(echo "scale=2; $restart_gap / $elastic_gap" | bc)"
