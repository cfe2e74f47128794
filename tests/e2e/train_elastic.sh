#!/usr/bin/env bash
# train --elastic (examples/mobilenetv3) through three elastic launchers on loopback
# (--nnodes=2:3, the dpar rendezvous on node a): the member that is rank 2 of round 0 kills
# itself after global step 3 (DPAR_TEST_DIE_AT_STEP=3:2). The other two must form a round of
# 2 in the same processes, keep the global batch (2 micro-batches of 12 instead of 1 of 16),
# finish all 12 steps of the 2 epochs (none lost or repeated), and rank 0 writes the weights.
# The round's rank 0 writes the TensorBoard events. Also: an option elastic training does not
# support is refused with one line. (The scratch clean-up finds the job's processes by $marker,
# in their --output-dir.)
# Usage: train_elastic.sh <train> <dpar-launch>
set -u
train=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../launch/common.sh" "$2" "$train"

slow=1
[ -n "${TSAN_OPTIONS:-}${ASAN_OPTIONS:-}" ] && slow=10
export DPAR_ELASTIC_SETTLE=$slow DPAR_ELASTIC_DETECT=$((3 * slow))
args=(--elastic --epochs 2 --limit-train 288 --limit-val 64 --batch-size 16 --img-size 32
  --print-freq 2 --workers 0 --threads 1)
for name in a b c; do
  DPAR_TEST_DIE_AT_STEP=3:2 "$launcher" --nnodes=2:3 --rdzv_endpoint="127.0.0.1:$port" \
    --rdzv_id=train-elastic --log_dir="$work/$name" "$train" "${args[@]}" \
    --output-dir="$work/$marker/out_$name" --export=false --tensorboard="$work/tb_$name" \
    >"$work/$name.out" 2>&1 &
  eval "pid_$name=$!"
  sleep 0.5 # a hosts the store and arrives first; c arrives last: rank 2, the one that dies
done
for name in a b c; do
  pid=$(eval echo "\$pid_$name")
  deadline=$((SECONDS + 120 * slow))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.3; done
  kill -0 "$pid" 2>/dev/null && { fail "node $name still runs after $((120 * slow)) s"; kill -KILL "$pid"; }
  wait "$pid"
  eval "code_$name=$?"
done

expect_text "$work/c/workerlog.0" "elastic: round 0: rank 2 of 3"
expect_text "$work/c/workerlog.0" "DPAR_TEST_DIE_AT_STEP: killing this process (SIGKILL) after global step 3"
[ "$code_c" != 0 ] && ok "node c's launcher reported its killed process ($code_c)" ||
  fail "node c's launcher exited 0"
for name in a b; do
  log=$work/$name/workerlog.0
  [ "$(eval echo "\$code_$name")" = 0 ] && ok "node $name's launcher exited 0" ||
    { fail "node $name's launcher exited $(eval echo "\$code_$name")"; sed 's/^/    /' "$log"; }
  # One process through both rounds, resumed at the last commit (step 3) with 2 x 12 images.
  expect_text "$log" "elastic: round 0: rank"
  expect_text "$log" "of 2 at epoch 0, step 3"
  expect_text "$log" "2 x 12 images per rank and step"
  expect_text "$log" "elastic: finished 12 steps of 2 epochs as rank"
done
expect_text "$work/a/workerlog.0" "[Epoch 1, iter: 6] top1:"
expect_text "$work/a/workerlog.0" "final: top1"
[ -s "$work/$marker/out_a/mobilenet_v3_small.safetensors" ] && ok "rank 0 wrote the weights" ||
  fail "no weights in $work/$marker/out_a"

# TensorBoard: node a is rank 0 in both rounds: one event file, every logged step and both
# evaluations, the same figures as its log lines; b and c (never rank 0) write none.
for name in b c; do
  [ -z "$(ls "$work/tb_$name" 2>/dev/null)" ] && ok "node $name wrote no event file" ||
    fail "node $name wrote event files: $(ls "$work/tb_$name")"
done
if /usr/bin/python3 - "$here/../../scripts" "$work/tb_a" "$work/a/workerlog.0" <<'PY'; then
import glob, re, sys
sys.path.insert(0, sys.argv[1])
import tb_events
files = glob.glob(sys.argv[2] + "/events.out.tfevents.*")
assert len(files) == 1, files
events, problems = tb_events.read_events(files[0])
assert not problems, problems
by_tag = {}
for _, step, tag, value in events:
    by_tag.setdefault(tag, []).append((step, value))
assert [s for s, _ in by_tag["train/loss"]] == [2, 4, 6, 8, 10, 12], by_tag["train/loss"]
assert [s for s, _ in by_tag["eval/top1"]] == [6, 12], by_tag["eval/top1"]
losses = [float(x) for x in re.findall(r"\[Epoch \d+, iter: \d+\] top1: [\d.]+, top5: [\d.]+, "
                                      r"lr: [\d.]+, loss: ([\d.]+)", open(sys.argv[3]).read())]
assert len(losses) == 6 and all(abs(a - v) < 1e-5 for a, (_, v) in zip(losses, by_tag["train/loss"])), losses
PY
  ok "node a's event file holds steps 2..12 and both evaluations, as its log lines"
else
  fail "node a's TensorBoard events"
fi

"$launcher" --nnodes=2:3 --rdzv_endpoint="127.0.0.1:$((port + 1))" --elastic_timeout=1 --log_dir="$work/bad" \
  "$train" --elastic --shard optimizer >"$work/bad.out" 2>&1
[ $? -ne 0 ] && ok "--elastic --shard refused" || fail "--elastic --shard ran"
expect_text "$work/bad/workerlog.0" "train --elastic: --shard: not supported by elastic training yet"
exit $((failures > 0))
