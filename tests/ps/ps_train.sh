#!/usr/bin/env bash
# Parameter-server training through dpar-launch on loopback, checked against collective mode:
#   1. sync, 2 servers x 2 trainers (--server_num/--trainer_num) ends with the same weights
#      (<= 1e-5 relative) as DataParallel on 2 ranks with the same data and recipe; servers
#      log serverlog.N and stop by themselves once the trainers finish; launcher exit 0;
#   2. the same job described by --servers/--trainers with one launcher per "node"
#      (127.0.0.1 and 127.0.0.2): exit 0 and the same weights again;
#   3. a sync job whose trainer 0 dies, resumed with --resume auto: the servers restore the
#      shards they saved with trainer 0's checkpoint and the weights end as in 1;
#   4. async and GEO runs whose loss decreases (async also writes TensorBoard files: trainer 0
#      all scalars, trainer 1 its own images/s).
# Usage: ps_train.sh <train> <dpar-launch> <python3> <source dir>
set -u
source "$(dirname "$0")/common.sh" "$@"
python=$3
src=$4
epochs=(--epochs 2)

run() {  # run NAME LAUNCHER_FLAGS... -- TRAIN_FLAGS...
  local name=$1
  shift
  local lflags=()
  while [ "$1" != "--" ]; do lflags+=("$1"); shift; done
  shift
  timeout -k 5 240 "$launcher" "${lflags[@]}" --log_dir="$work/$name/log" "$train" "${recipe[@]}" \
    "$@" --output-dir="$work/$name/out" --loss-log="$work/$name/loss.log" \
    >"$work/$name.out" 2>&1
}

compare_weights() {  # A B what
  if "$python" - "$src/tests/parity" "$1" "$2" <<'PY'; then ok "$3"; else fail "$3"; fi
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from safetensors_io import load
a, b = load(sys.argv[2]), load(sys.argv[3])
assert a.keys() == b.keys(), "different tensor names"
worst, where = 0.0, ""
for k in a:
    x, y = np.asarray(a[k], np.float64), np.asarray(b[k], np.float64)
    if x.size == 0 or x.dtype.kind not in "f":
        continue
    rel = float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-3)))
    if rel > worst:
        worst, where = rel, k
print(f"  largest relative difference {worst:.3g} ({where}) over {len(a)} tensors")
sys.exit(0 if worst <= 1e-5 else 1)
PY
}

loss_decreases() {  # NAME: mean loss of the last quarter below the first quarter, per trainer
  local f
  for f in "$work/$1"/loss.log.rank*; do
    if "$python" - "$f" <<'PY'; then ok "$1: loss decreases ($(basename "$f"))"; else fail "$1: loss does not decrease in $f"; fi
import sys
v = [float.fromhex(line.split()[2]) for line in open(sys.argv[1])]
q = len(v) // 4
a, b = sum(v[:q]) / q, sum(v[-q:]) / q
print(f"  {sys.argv[1]}: mean loss of the first {q} steps {a:.4f}, of the last {q} {b:.4f}")
sys.exit(0 if b < a else 1)
PY
  done
}

echo "== collective reference: 2 ranks"
run collective --nproc_per_node=2 --start_port=$port -- "${epochs[@]}" ||
  { fail "collective run failed"; tail -n 20 "$work/collective.out"; }

echo "== sync ps: 2 servers x 2 trainers on one node"
if run sync --run_mode=ps --server_num=2 --trainer_num=2 --start_port=$((port + 3)) -- \
  "${epochs[@]}" --ps-mode sync; then ok "sync ps job exit 0"; else
  fail "sync ps job failed"; tail -n 30 "$work/sync.out"
fi
for i in 0 1; do
  expect_text "$work/sync/log/serverlog.$i" "ps server $i of 2 listening on 127.0.0.1:$((port + 3 + i))"
  expect_text "$work/sync/log/serverlog.$i" "all 2 trainers finished"
  expect_text "$work/sync/log/workerlog.$i" "ps trainer $i: sync mode"
done
compare_weights "$work/sync/out/mobilenet_v3_small.safetensors" \
  "$work/collective/out/mobilenet_v3_small.safetensors" "sync ps weights == collective weights"

echo "== sync ps across two loopback nodes: --servers/--trainers, one launcher per node"
servers=127.0.0.1:$((port + 6)),127.0.0.2:$((port + 6))
for k in 0 1; do
  ip=127.0.0.$((k + 1))
  timeout -k 5 240 "$launcher" --run_mode=ps --servers=$servers --trainers=127.0.0.1,127.0.0.2 \
    --host=$ip --job_token="tok_$marker" --log_dir="$work/nodes/log$k" "$train" "${recipe[@]}" \
    "${epochs[@]}" --ps-mode sync --output-dir="$work/nodes/out$k" >"$work/nodes$k.out" 2>&1 &
  pids[k]=$!
done
for k in 0 1; do
  if wait "${pids[$k]}"; then ok "node $k launcher exit 0"; else
    fail "node $k launcher failed"; tail -n 20 "$work/nodes$k.out"
  fi
done
compare_weights "$work/nodes/out0/mobilenet_v3_small.safetensors" \
  "$work/collective/out/mobilenet_v3_small.safetensors" "two-node sync ps weights == collective weights"

echo "== sync ps resumed: trainer 0 dies at step 11, servers saved shards at step 8; --resume"
ckpt=(--checkpoint-dir "$work/resume/ckpt" --step-interval 4)
DPAR_TEST_DIE_AT_STEP=11:0 run resume --run_mode=ps --server_num=2 --trainer_num=2 \
  --start_port=$((port + 3)) -- "${epochs[@]}" --ps-mode sync "${ckpt[@]}" &&
  fail "the job survived its trainer 0 dying"
ls "$work/resume/ckpt"/pserver.1.step8.safetensors >/dev/null 2>&1 &&
  ok "server 1 saved its shard at step 8" || fail "no pserver.1.step8.safetensors in $work/resume/ckpt"
if run resume --run_mode=ps --server_num=2 --trainer_num=2 --start_port=$((port + 3)) -- \
  "${epochs[@]}" --ps-mode sync "${ckpt[@]}" --resume auto; then ok "resumed job exit 0"; else
  fail "resumed job failed"; tail -n 20 "$work/resume.out"
fi
expect_text "$work/resume/log/serverlog.0" "resumed at step 8"
compare_weights "$work/resume/out/mobilenet_v3_small.safetensors" \
  "$work/collective/out/mobilenet_v3_small.safetensors" "resumed sync ps weights == collective weights"

echo "== async ps: 2 servers x 2 trainers, with TensorBoard files"
run async --run_mode=ps --server_num=2 --trainer_num=2 --start_port=$((port + 3)) -- \
  --epochs 3 --ps-mode async --max-staleness 2 --tensorboard "$work/async/tb" ||
  { fail "async job failed"; tail -n 20 "$work/async.out"; }
loss_decreases async
# Trainer 0 writes every scalar; trainer 1 (no collective group in ps mode) its own images/s in
# a file of its own beside it.
if "$python" - "$src/scripts" "$work/async/tb" <<'PY'; then ok "ps TensorBoard files: trainer 0's scalars and rank1/ips"; else fail "ps TensorBoard files"; fi
import glob, os, sys
sys.path.insert(0, sys.argv[1])
import tb_events
files = sorted(glob.glob(os.path.join(sys.argv[2], "events.out.tfevents.*")))
assert len(files) == 2, files
tags = {}
for f in files:
    events, problems = tb_events.read_events(f)
    assert not problems, problems
    tags[f.endswith(".rank1")] = {tag for _, _, tag, _ in events}
assert tags[True] == {"rank1/ips"}, tags[True]
assert {"train/loss", "rank0/ips", "eval/top1"} <= tags[False], tags[False]
assert "rank1/ips" not in tags[False]
PY

echo "== geo ps: 2 servers x 2 trainers, deltas every 4 steps"
run geo --run_mode=ps --server_num=2 --trainer_num=2 --start_port=$((port + 3)) -- \
  --epochs 3 --ps-mode geo --geo-k-steps 4 || { fail "geo job failed"; tail -n 20 "$work/geo.out"; }
loss_decreases geo

expect_no_job_processes
finish
