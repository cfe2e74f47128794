#!/usr/bin/env bash
# train --shard through dpar-launch (CPU):
#   A, B  2 ranks, --shard none and --shard gradients: the same loss at every step on every
#         rank and the same final weights (cmp): sharding changes no result;
#   B     also keeps step checkpoints (--step-interval 3, 2 kept): each names an optimizer
#         shard set beside it, the sets of rotated-out files are gone, and the log line shows
#         the gradients and optimizer state per rank at half of A's;
#   C     B's folder resumed (--resume auto) on 3 ranks with --shard optimizer and one more
#         epoch: it continues at B's global step, noting the world size change;
#   D     B's step-15 checkpoint resumed on 1 process without sharding (the shard set loads as
#         whole parameters) and, in the same folder, once more on 2 ranks sharded.
# Usage: train_shard.sh <train> <dpar-launch>
set -u
train=$1
launcher=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }
source "$(dirname "${BASH_SOURCE[0]}")/../port_block.sh"
take_port_block || exit 1
common=(--limit-train 512 --limit-val 64 --img-size 32 --batch-size 32 --print-freq 4
        --workers 1 --seed 5)
export OMP_NUM_THREADS=1
launch() {  # launch <name> <nproc> [train flags]
  local name=$1 n=$2
  shift 2
  "$launcher" --nproc_per_node="$n" --start_port=$port --log_dir="$work/log_$name" \
    "$train" "${common[@]}" "$@" >"$work/$name.out" 2>&1 || {
    fail "run $name failed"
    tail -20 "$work/$name.out"
    for f in "$work/log_$name"/workerlog.*; do tail -5 "$f"; done
    exit 1
  }
}

# ---- A and B: sharding changes no result -----------------------------------------------------
launch A 2 --epochs 2 --shard none --loss-log "$work/A.loss" --output-dir "$work/out_A"
launch B 2 --epochs 2 --shard gradients --loss-log "$work/B.loss" --output-dir "$work/out_B" \
  --checkpoint-dir "$work/ckpt" --step-interval 3 --max-num-checkpoints 2
for r in 0 1; do
  if cmp -s "$work/A.loss.rank$r" "$work/B.loss.rank$r"; then
    ok "rank $r: --shard gradients logs the same loss as --shard none at all $(wc -l <"$work/A.loss.rank$r") steps"
  else
    fail "rank $r: the losses differ"
    diff "$work/A.loss.rank$r" "$work/B.loss.rank$r" | head -5
  fi
done
cmp -s "$work/out_A/mobilenet_v3_small.safetensors" "$work/out_B/mobilenet_v3_small.safetensors" &&
  ok "final weights bitwise equal" || fail "final weights differ"

memory() {  # memory <log> <part>: the first log line's MB of that part
  sed -n "s/.*memory per rank: .*$2 \([0-9.]*\) MB.*/\1/p" "$1" | head -1
}
grads_a=$(memory "$work/A.out" grads) grads_b=$(memory "$work/B.out" grads)
opt_a=$(memory "$work/A.out" optimizer) opt_b=$(memory "$work/B.out" optimizer)
echo "memory per rank: grads $grads_a -> $grads_b MB, optimizer $opt_a -> $opt_b MB"
awk -v a="$grads_a" -v b="$grads_b" 'BEGIN { exit !(b > 0 && b <= a / 2 + 0.05) }' &&
  ok "gradients per rank halved" || fail "gradients per rank $grads_b MB, unsharded $grads_a MB"
awk -v a="$opt_a" -v b="$opt_b" 'BEGIN { exit !(b > 0 && b <= a / 2 + 0.05) }' &&
  ok "optimizer state per rank halved" || fail "optimizer state $opt_b MB, unsharded $opt_a MB"

# Every checkpoint names a complete set; no set is left that none names.
named=$(for f in "$work/ckpt"/*.ckpt; do
  grep -ao 'optimizer_shards[\\":]*optimizer_step_[0-9]*' "$f" | head -1 | grep -o 'optimizer_step_[0-9]*'
done | sort -u)
present=$(cd "$work/ckpt" && ls -d optimizer_step_* | sort)
[ -n "$named" ] && ok "checkpoints name shard sets: $(echo $named)" || fail "no checkpoint names a shard set"
[ "$named" = "$present" ] && ok "exactly the named sets are kept" ||
  fail "sets named: $(echo $named); present: $(echo $present)"
for set in $present; do
  [ -f "$work/ckpt/$set/index.json" ] || fail "$set has no index"
done

# ---- C: 3 ranks, another sharding mode, one more epoch ----------------------------------------
cp -r "$work/ckpt" "$work/ckpt_C"
launch C 3 --epochs 3 --shard optimizer --checkpoint-dir "$work/ckpt_C" --resume auto
grep -q "global step 16" "$work/C.out" && ok "C resumed at global step 16" || fail "C did not resume at step 16"
grep -q "note: the checkpoint was written with world size 2" "$work/C.out" &&
  ok "C notes the world size change" || fail "no note about the world size"
grep -q "^\[Eval\]\[Epoch 2\]" "$work/C.out" && ok "C trained epoch 2" || fail "C did not train epoch 2"

# ---- D: one process, unsharded, from the mid-epoch step checkpoint; then 2 ranks again --------
mkdir -p "$work/ckpt_D"
cp "$work/ckpt/step_15.ckpt" "$work/ckpt_D/"
cp -r "$work/ckpt/optimizer_step_15" "$work/ckpt_D/"
"$train" "${common[@]}" --epochs 2 --checkpoint-dir "$work/ckpt_D" --resume auto >"$work/D.out" 2>&1 ||
  { fail "D failed"; tail -20 "$work/D.out"; }
grep -q "global step 15" "$work/D.out" && ok "D resumed at global step 15 on 1 process" ||
  fail "D did not resume at step 15"
launch D2 2 --epochs 3 --shard gradients --checkpoint-dir "$work/ckpt_D" --resume auto
grep -q "^\[Eval\]\[Epoch 2\]" "$work/D2.out" && ok "D2 resumed D's unsharded checkpoint sharded" ||
  fail "D2 did not train epoch 2"

[ $failures -eq 0 ] && echo "train --shard: all checks passed" || { echo "$failures check(s) failed"; exit 1; }
