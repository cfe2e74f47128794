#!/usr/bin/env bash
# --resume continues exactly (CPU, 2 ranks through dpar-launch):
#   A  an uninterrupted run;
#   B  the same run, one rank SIGKILLed from this script when its log shows step k (k and the
#      rank random; RESUME_KILL_STEP / RESUME_KILL_RANK pin them), then resumed with
#      --resume auto from its last checkpoint;
#   C  B's checkpoints with the newest one torn (truncated): the resume skips it with a
#      warning naming it and continues from the one before;
#   D  dpar-launch --max_restarts=1 with a worker that kills itself once
#      (DPAR_TEST_DIE_AT_STEP): the automatic restart resumes from the latest checkpoint.
# B, C and D must end with final weights bitwise equal to A's (cmp).
# Usage: resume_exact.sh <train> <dpar-launch>
set -u
train=$1
launcher=$2
work=$(mktemp -d)
launcher_pid=
cleanup() {
  [ -n "$launcher_pid" ] && kill -KILL "$launcher_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }
start=$SECONDS

source "$(dirname "${BASH_SOURCE[0]}")/../port_block.sh"
take_port_block || exit 1  # a block no concurrent test holds
steps_per_epoch=8                       # 512 images / (2 ranks x 32)
common=(--limit-train 512 --limit-val 64 --img-size 32 --batch-size 32 --epochs 2
        --print-freq 1 --workers 1 --seed 5)
export OMP_NUM_THREADS=1
launch() {  # launch <name> [launcher flags] -- [train flags]
  local name=$1
  shift
  local lflags=()
  while [ "$1" != "--" ]; do lflags+=("$1"); shift; done
  shift
  "$launcher" --nproc_per_node=2 --start_port=$port --log_dir="$work/log_$name" "${lflags[@]}" \
    "$train" "${common[@]}" --output-dir "$work/out_$name" "$@" >"$work/$name.out" 2>&1
}
weights() { echo "$work/out_$1/mobilenet_v3_small.safetensors"; }
same_weights() {  # same_weights <name> <what>
  if cmp -s "$(weights A)" "$(weights "$1")"; then
    ok "$2: final weights bitwise equal to the uninterrupted run"
  else
    fail "$2: final weights differ from the uninterrupted run"
  fi
}

# ---- A: uninterrupted -----------------------------------------------------------------------
launch A -- || { fail "run A failed"; cat "$work/A.out"; exit 1; }
[ -f "$(weights A)" ] || { fail "run A wrote no weights"; exit 1; }

# ---- B: SIGKILL at a random step, then --resume auto ------------------------------------------
k=${RESUME_KILL_STEP:-$((5 + RANDOM % 9))}  # 5..13 of 16: at least two checkpoints exist (C)
victim=${RESUME_KILL_RANK:-$((RANDOM % 2))}
epoch=$(((k - 1) / steps_per_epoch))
iter=$(((k - 1) % steps_per_epoch + 1))
echo "B: killing rank $victim with SIGKILL when its log shows step $k (epoch $epoch, iter $iter)"
"$launcher" --nproc_per_node=2 --start_port=$port --log_dir="$work/log_B" "$train" "${common[@]}" \
  --output-dir "$work/out_B" --checkpoint-dir "$work/ck_B" --step-interval 2 \
  >"$work/B1.out" 2>&1 &
launcher_pid=$!
log="$work/log_B/workerlog.$victim"
deadline=$((SECONDS + 60))
until grep -q "^\[Epoch $epoch, iter: $iter\]" "$log" 2>/dev/null; do
  if [ $SECONDS -gt $deadline ] || ! kill -0 "$launcher_pid" 2>/dev/null; then
    fail "rank $victim never logged step $k"
    cat "$work/B1.out"
    exit 1
  fi
  sleep 0.01
done
victim_pid=
for pid in $(pgrep -P "$launcher_pid"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "DPAR_RANK=$victim"; then victim_pid=$pid; fi
done
[ -n "$victim_pid" ] || { fail "no worker process with DPAR_RANK=$victim"; exit 1; }
kill -KILL "$victim_pid"
wait "$launcher_pid"
rc=$?
launcher_pid=
if [ $rc -eq 0 ]; then
  fail "run B finished before the kill landed (step $k); nothing was resumed"
else
  ok "run B died (launcher exit $rc): $(grep -o 'rank [0-9] was killed by signal 9 (SIGKILL)' "$work/B1.out" | head -1)"
fi
cp -a "$work/ck_B" "$work/ck_C"  # the state the kill left (hard links kept), for C
launch B2 -- --checkpoint-dir "$work/ck_B" --step-interval 2 --resume auto
rc=$?
resumed=$(grep -o '^resumed from .*' "$work/B2.out" | head -1)
if [ $rc -ne 0 ]; then
  fail "resumed run B exited $rc"
  tail -20 "$work/B2.out"
elif [ -z "$resumed" ]; then
  fail "run B2 did not resume from a checkpoint"
else
  ok "$resumed"
  same_weights B2 "killed at step $k and resumed"
fi

# ---- C: the newest checkpoint torn: skipped with a warning, resumed from the previous one -----
# (newest by global step: step_N carries N; model_E sits at (E+1) x steps_per_epoch)
torn=$(for f in "$work/ck_C"/step_*.ckpt "$work/ck_C"/model_*.ckpt; do
  [ -f "$f" ] || continue
  b=$(basename "$f" .ckpt)
  case $b in step_*) g=${b#step_} ;; model_*) g=$(((${b#model_} + 1) * steps_per_epoch)) ;; esac
  echo "$g $f"
done | sort -n | tail -1 | cut -d' ' -f2)
if [ -z "$torn" ]; then
  fail "run B left no checkpoint to tear"
else
  size=$(stat -c %s "$torn")
  truncate -s $((size / 2)) "$torn"  # latest.ckpt is another name of this file: torn too
  launch C -- --checkpoint-dir "$work/ck_C" --step-interval 2 --resume auto
  rc=$?
  if [ $rc -ne 0 ]; then
    fail "run C exited $rc"
    tail -20 "$work/C.out"
  else
    if grep -q "warning: skipping corrupt checkpoint: .*$(basename "$torn")" "$work/C.out"; then
      ok "torn $(basename "$torn") skipped: $(grep -o 'warning: skipping corrupt checkpoint: .*' "$work/C.out" | head -1 | cut -c1-160)"
    else
      fail "no warning naming the torn $(basename "$torn")"
      grep -i warn "$work/C.out"
    fi
    ok "C: $(grep -o '^resumed from .*' "$work/C.out" | head -1)"
    same_weights C "resumed past a torn newest checkpoint"
  fi
fi

# ---- D: dpar-launch --max_restarts=1 and a worker that dies once -----------------------------
die_step=${RESUME_DIE_STEP:-$((3 + RANDOM % 11))}
die_rank=$((RANDOM % 2))
echo "D: rank $die_rank kills itself after step $die_step (DPAR_TEST_DIE_AT_STEP); --max_restarts=1"
DPAR_TEST_DIE_AT_STEP=$die_step:$die_rank launch D --max_restarts=1 -- \
  --checkpoint-dir "$work/ck_D" --step-interval 2 --resume auto
rc=$?
if [ $rc -ne 0 ]; then
  fail "run D exited $rc"
  tail -20 "$work/D.out"
else
  grep -q "restarting all 2 local process(es) (restart 1 of 1)" "$work/D.out" &&
    ok "the launcher restarted the job" || fail "no restart in the launcher's output"
  ok "D: $(grep -o '^resumed from .*' "$work/D.out" | head -1)"
  same_weights D "automatic restart"
fi

# ---- E: one process, resumed from a step checkpoint at an epoch's very end -------------------
# With --epoch-interval 2, epoch 0 gets no epoch checkpoint, so step_2 (epoch 0, step 2 of 2)
# is the resume point: the resumed run trains no batch of epoch 0, evaluates it, goes on.
one=(--limit-train 64 --limit-val 16 --batch-size 32 --epochs 3 --img-size 32 --threads 1
     --workers 0 --print-freq 100 --seed 5 --export=false)
"$train" "${one[@]}" --output-dir "$work/out_E1" >"$work/E1.out" 2>&1 || fail "run E1 failed"
(DPAR_TEST_DIE_AT_STEP=3 "$train" "${one[@]}" --output-dir "$work/out_E2" --checkpoint-dir "$work/ck_E" \
  --epoch-interval 2 --step-interval 2 --resume auto >"$work/E2.out" 2>&1; exit $?) 2>/dev/null  # quiet "Killed"
[ $? -eq 137 ] || fail "run E2 did not die by SIGKILL after step 3"
"$train" "${one[@]}" --output-dir "$work/out_E2" --checkpoint-dir "$work/ck_E" --epoch-interval 2 \
  --step-interval 2 --resume auto >"$work/E3.out" 2>&1 || fail "run E3 failed"
if grep -q "^resumed from .*step_2.ckpt: epoch 0, step 2 of 2" "$work/E3.out" &&
  cmp -s "$work/out_E1/mobilenet_v3_small.safetensors" "$work/out_E2/mobilenet_v3_small.safetensors"; then
  ok "E: resumed at the end of epoch 0 (1 process): final weights bitwise equal"
else
  fail "E: resume at an epoch's end"
  grep -v '^\[Epoch' "$work/E3.out"
fi

echo "resume test took $((SECONDS - start)) s"
if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
