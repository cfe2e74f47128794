#!/usr/bin/env bash
# train --elastic's checkpoints on disk are the fixed-world trainer's: either trainer resumes
# the other's, at any world size. A job planned for 2 members (global batch 2 x 16, 8 steps per
# epoch, 2 epochs) on loopback:
#   A  the fixed-world trainer, 2 ranks, uninterrupted, a checkpoint every 3 steps (reference)
#   E  train --elastic, 2 members, a checkpoint every 3 steps: at its full world it trains what
#      A does (bitwise) and writes the same checkpoint files
#   F  the fixed-world trainer resumed from E's step 6 (inside epoch 0): A's weights, bitwise
#   G  train --elastic resumed from A's step 9 (inside epoch 1): A's weights, bitwise; the
#      final rank 0 exports the ONNX inference model
#   W  the whole elastic job SIGKILLed after its step-4 checkpoint (store host included), then
#      started again with --resume auto; each node has its own checkpoint folder, so only node
#      a finds one. b starts first: the round must still take a's state (the most advanced),
#      and end with A's weights, bitwise
#   H  another shape: a 1-process run (16 steps per epoch) stopped after step 5 is resumed by
#      train --elastic (note printed; 18 steps in all), whose step-6 checkpoint records where
#      epoch 0's order stands; the fixed-world trainer resumes that one at that sample, and
#      its own next checkpoint records the sample it reached in turn
#   P  one epoch from A's weights (--pretrained) in either trainer: the same weights, bitwise
# Also: --elastic --checkpoint-dir without --resume is refused with one line.
# Usage: train_elastic_checkpoint.sh <train> <dpar-launch>
set -u
train=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../launch/common.sh" "$2" "$train"
start=$SECONDS

slow=1
[ -n "${TSAN_OPTIONS:-}${ASAN_OPTIONS:-}" ] && slow=10
export DPAR_ELASTIC_SETTLE=$slow DPAR_ELASTIC_DETECT=$((3 * slow)) OMP_NUM_THREADS=1
common=(--limit-train 256 --limit-val 32 --batch-size 16 --img-size 32 --epochs 2 --workers 0
  --threads 1 --seed 5 --print-freq 1 --export=false --max-num-checkpoints 0)
out() { echo "$work/$marker/out_$1"; }
weights() { echo "$(out "$1")/mobilenet_v3_small.safetensors"; }
same_as_A() {  # same_as_A <run> <what>
  if [ -f "$(weights "$1")" ] && cmp -s "$(weights A)" "$(weights "$1")"; then
    ok "$2: final weights bitwise equal to A's"
  else
    fail "$2: final weights differ from A's (or are missing)"
  fi
}
# fixed <name> <processes> [train flags]: the fixed-world trainer through dpar-launch.
fixed() {
  local name=$1 nproc=$2
  shift 2
  "$launcher" --nproc_per_node="$nproc" --start_port="$port" --log_dir="$work/log_$name" \
    "$train" "${common[@]}" --output-dir "$(out "$name")" "$@" >"$work/$name.out" 2>&1 ||
    { fail "run $name exited $?"; tail -5 "$work/$name.out" | sed 's/^/    /'; }
}
# elastic_start <name> <rdzv port> <flags of a> -- <flags of b> [-- b_first]: two elastic
# launchers (--nnodes=2:2, the store on a's launcher), logs in $work/<name>_{a,b}.
elastic_start() {
  local name=$1 rport=$2 order=ab
  shift 2
  local fa=() fb=()
  while [ "$1" != "--" ]; do fa+=("$1"); shift; done
  shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do fb+=("$1"); shift; done
  [ "${2:-}" = b_first ] && order=ba
  for node in $(echo "$order" | grep -o .); do
    local flags=("${fa[@]}")
    [ "$node" = b ] && flags=("${fb[@]}")
    "$launcher" --nnodes=2:2 --rdzv_endpoint="127.0.0.1:$rport" --rdzv_id="$name" \
      --log_dir="$work/${name}_$node" "$train" --elastic "${common[@]}" \
      --output-dir "$(out "$name")" "${flags[@]}" >"$work/${name}_$node.out" 2>&1 &
    eval "pid_$node=$!"
    sleep 0.5
  done
}
elastic_wait() {  # elastic_wait <name>
  local node pid
  for node in a b; do
    pid=$(eval echo "\$pid_$node")
    local deadline=$((SECONDS + 120 * slow))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.3; done
    kill -0 "$pid" 2>/dev/null && { fail "$1: node $node still runs"; kill -KILL "$pid"; }
    wait "$pid" || { fail "$1: node $node's launcher exited $?"; tail -5 "$work/$1_$node/workerlog.0" | sed 's/^/    /'; }
  done
}
# The "extra" entry <key> of a checkpoint's training state (its safetensors header's metadata).
extra_of() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    state = json.loads(json.loads(f.read(n))["__metadata__"]["dpar.checkpoint"])
print(state["extra"].get(sys.argv[2], ""))
EOF
}

# ---- A: the fixed-world reference --------------------------------------------------------------
fixed A 2 --checkpoint-dir "$work/ck_A" --step-interval 3
[ -f "$(weights A)" ] || { fail "run A wrote no weights"; exit 1; }

# ---- E: elastic at its full world --------------------------------------------------------------
ck=(--checkpoint-dir "$work/ck_E" --resume auto --step-interval 3)
elastic_start E $((port + 2)) "${ck[@]}" -- "${ck[@]}"
elastic_wait E
same_as_A E "E (train --elastic, 2 of 2 members)"
files_A=$(cd "$work/ck_A" && ls | tr '\n' ' ')
files_E=$(cd "$work/ck_E" 2>/dev/null && ls | tr '\n' ' ')
[ "$files_A" = "$files_E" ] && ok "E wrote A's checkpoint files: $files_E" ||
  fail "E's checkpoint files ($files_E) are not A's ($files_A)"
expect_text "$work/E_a/workerlog.0" "--resume auto: no checkpoint in $work/ck_E yet; starting from scratch"

# ---- F and G: each trainer resumes the other's checkpoint --------------------------------------
fixed F 2 --resume "$work/ck_E/step_6.ckpt"
expect_text "$work/log_F/workerlog.0" "resumed from $work/ck_E/step_6.ckpt: epoch 0, step 6 of 8, global step 6"
same_as_A F "F (fixed-world, from the elastic step 6)"
ck=(--resume "$work/ck_A/step_9.ckpt" --export=true)
elastic_start G $((port + 3)) "${ck[@]}" -- "${ck[@]}"
elastic_wait G
[ -s "$(out G)/inference/inference.onnx" ] && ok "G: the final rank 0 exported the inference model" ||
  fail "G: no $(out G)/inference/inference.onnx"
expect_text "$work/G_a/workerlog.0" "resumed from $work/ck_A/step_9.ckpt: epoch 1, step 1 of 8, global step 9"
expect_text "$work/G_a/workerlog.0" "elastic: finished 16 steps of 2 epochs"
same_as_A G "G (elastic, from the fixed-world step 9)"

# ---- W: the whole elastic job killed, then resumed from node a's folder ------------------------
elastic_start W $((port + 4)) --checkpoint-dir "$work/ck_Wa" --resume auto --step-interval 2 -- \
  --checkpoint-dir "$work/ck_Wb" --resume auto --step-interval 2
deadline=$((SECONDS + 60 * slow))
until grep -q "saved checkpoint $work/ck_Wa/step_4.ckpt" "$work/W_a/workerlog.0" 2>/dev/null; do
  [ $SECONDS -gt $deadline ] && break
  sleep 0.05
done
pkill -KILL -f -- "$(out W)"  # both launchers and both workers, the store with a's launcher
wait "$pid_a" "$pid_b" 2>/dev/null
if ! grep -q "saved checkpoint $work/ck_Wa/step_4.ckpt" "$work/W_a/workerlog.0"; then
  fail "W: node a never saved step 4"
  tail -5 "$work/W_a/workerlog.0" | sed 's/^/    /'
elif grep -q "elastic: finished" "$work/W_a/workerlog.0"; then
  fail "W: the job finished before the kill landed"
else
  ok "W: killed after $(grep -c '^saved checkpoint' "$work/W_a/workerlog.0") checkpoint(s)"
  mv "$work/W_a" "$work/W1_a" && mv "$work/W_b" "$work/W1_b"
  elastic_start W $((port + 5)) --checkpoint-dir "$work/ck_Wa" --resume auto --step-interval 2 -- \
    --checkpoint-dir "$work/ck_Wb" --resume auto --step-interval 2 -- b_first
  elastic_wait W
  expect_text "$work/W_b/workerlog.0" "--resume auto: no checkpoint in $work/ck_Wb yet; starting from scratch"
  expect_text "$work/W_a/workerlog.0" "resumed from $work/ck_Wa/"
  # b starts with nothing, so its first round is at a's position, from a (the final weights
  # alone would not tell: a run from scratch ends with them too).
  at=$(sed -n 's/^resumed from .*: epoch \([0-9]*\), step [0-9]* of 8, global step \([0-9]*\) .*/epoch \1, step \2/p' \
    "$work/W_a/workerlog.0")
  expect_text "$work/W_a/workerlog.0" "elastic: round 0: rank 0 of 2 at ${at:-?}"
  expect_text "$work/W_b/workerlog.0" "elastic: round 0: rank 1 of 2 at ${at:-?}"
  same_as_A W "W (the whole job killed, resumed from node a's checkpoint)"
fi

# ---- H: another shape each way ---------------------------------------------------------------
"$train" "${common[@]}" --checkpoint-dir "$work/ck_H" --step-interval 5 \
  --output-dir "$(out H1)" >"$work/H1.out" 2>&1 || fail "run H1 exited $?"
ck=(--resume "$work/ck_H/step_5.ckpt" --checkpoint-dir "$work/ck_H2" --step-interval 6)
elastic_start H $((port + 6)) "${ck[@]}" -- "${ck[@]}"
elastic_wait H
# 1 x 16 images a step for 5 steps: sample 80 of 256; with 32 a step, 5 steps of epoch 0 are
# left (first step 3), the order continuing at sample 80 = 3 x 32 - 16.
expect_text "$work/H_a/workerlog.0" "this run has world size 2 x batch 16, 8 steps/epoch; training continues at global step 5 and at sample 80 of epoch 0's order, but not bitwise"
expect_text "$work/H_a/workerlog.0" "elastic: finished 18 steps of 2 epochs"
consumed=$(extra_of "$work/ck_H2/step_6.ckpt" epoch_samples_consumed)
[ "$consumed" = 112 ] && ok "H: the elastic step-6 checkpoint records sample 112 of epoch 0" ||
  fail "H: step_6.ckpt records epoch_samples_consumed '$consumed', expected 112 (80 + 1 x 32)"
"$train" "${common[@]}" --resume "$work/ck_H2/step_6.ckpt" --output-dir "$(out H3)" \
  --checkpoint-dir "$work/ck_H3" --step-interval 8 >"$work/H3.out" 2>&1 || fail "run H3 exited $?"
expect_text "$work/H3.out" "training continues at global step 6 and at sample 112 of epoch 0's order"
# ... and its own checkpoint two steps of 16 later records sample 144 in turn.
consumed=$(extra_of "$work/ck_H3/step_8.ckpt" epoch_samples_consumed)
[ "$consumed" = 144 ] && ok "H: the fixed-world step-8 checkpoint records sample 144 of epoch 0" ||
  fail "H: step_8.ckpt records epoch_samples_consumed '$consumed', expected 144 (112 + 2 x 16)"

# ---- P: --pretrained, in either trainer ------------------------------------------------------
pre=(--pretrained "$(weights A)" --epochs 1)
fixed P1 2 "${pre[@]}"
elastic_start P2 $((port + 7)) "${pre[@]}" -- "${pre[@]}"
elastic_wait P2
expect_text "$work/P2_b/workerlog.0" "loaded pretrained weights from $(weights A)"
if [ -f "$(weights P2)" ] && cmp -s "$(weights P1)" "$(weights P2)"; then
  ok "P: an epoch from A's weights (--pretrained): the elastic job's weights equal the fixed-world run's"
else
  fail "P: --pretrained: the elastic job's weights differ from the fixed-world run's (or are missing)"
fi

# ---- refused ---------------------------------------------------------------------------------
"$train" --elastic --checkpoint-dir "$work/ck_bad" >"$work/bad.out" 2>&1
[ $? -ne 0 ] && ok "--elastic --checkpoint-dir without --resume refused" ||
  fail "--elastic --checkpoint-dir without --resume ran"
expect_text "$work/bad.out" "train --elastic: --checkpoint-dir needs --resume auto"

echo "elastic checkpoint test took $((SECONDS - start)) s"
exit $((failures > 0))
