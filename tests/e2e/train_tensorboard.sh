#!/usr/bin/env bash
# train --tensorboard: a 2-rank job's event files (read back by scripts/tb_events.py, which
# checks every record's CRC with python3-crc32c, independently of the writer's ISA-L), the
# values against the log lines, every rank's images/s, the bare flag's default folder, a run
# killed mid-training (its file readable; a torn last record skipped), a resumed run adding a
# file without touching the old one, scripts/plot_run.py drawing the run, and the progress
# lines of evaluation and checkpoint writing on a terminal.
#   train_tensorboard.sh <train> <dpar-launch> <python3> <source dir>
set -euo pipefail
train=$1 launch=$2 python=$3 src=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--limit-train 1024 --limit-val 256 --epochs 2 --batch-size 64 --img-size 32 --threads 1
        --print-freq 4)

# 1. Two ranks: 1024 images / 2 ranks / batch 64 = 8 steps per epoch; logs at 4, 8, 12, 16.
"$launch" --nproc_per_node=2 --log_dir="$work/log" "$train" "${common[@]}" \
  --tensorboard "$work/tb" --checkpoint-dir "$work/ckpt" >"$work/job.out" 2>&1 \
  || { cat "$work/job.out"; exit 1; }
grep -q "tensorboard: writing $work/tb/events.out.tfevents." "$work/log/workerlog.0" \
  || { echo "rank 0 did not name its event file"; cat "$work/log/workerlog.0"; exit 1; }
if grep -q "tensorboard: writing" "$work/log/workerlog.1"; then
  echo "rank 1 wrote an event file"; exit 1
fi
"$python" - "$src/scripts" "$work/tb" "$work/log/workerlog.0" <<'PY'
import glob, os, re, sys
sys.path.insert(0, sys.argv[1])
import tb_events
tb_dir, log_path = sys.argv[2], sys.argv[3]
files = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
assert len(files) == 1, files
events, problems = tb_events.read_events(files[0])
assert not problems, problems
by_tag = {}
for wall, step, tag, value in events:
    by_tag.setdefault(tag, []).append((step, value))
    assert wall > 1.6e9, wall
train_tags = ["train/loss", "train/top1", "train/top5", "train/lr", "train/ips",
              "train/reader_cost", "train/batch_cost", "train/peak_memory_mb",
              "rank0/ips", "rank1/ips"]
for tag in train_tags:
    steps = [s for s, _ in by_tag.get(tag, [])]
    assert steps == [4, 8, 12, 16], (tag, steps)
for tag in ["eval/loss", "eval/top1", "eval/top5"]:
    steps = [s for s, _ in by_tag.get(tag, [])]
    assert steps == [8, 16], (tag, steps)
# The log lines of rank 0 carry the same figures (printed to 5 decimals).
log = open(log_path).read()
train_lines = re.findall(r"\[Epoch \d+, iter: \d+\] top1: ([\d.]+), top5: ([\d.]+), lr: ([\d.]+), "
                         r"loss: ([\d.]+),.*avg_ips: ([\d.]+) images/sec", log)
assert len(train_lines) == 4, train_lines
for i, (top1, top5, lr, loss, ips) in enumerate(train_lines):
    assert abs(by_tag["train/loss"][i][1] - float(loss)) < 1e-5, (i, loss, by_tag["train/loss"][i])
    assert abs(by_tag["train/top1"][i][1] - float(top1)) < 1e-5
    assert abs(by_tag["train/lr"][i][1] - float(lr)) < 1e-6
    assert abs(by_tag["train/ips"][i][1] - float(ips)) < 0.01 * float(ips)
    assert abs(by_tag["rank0/ips"][i][1] - float(ips)) < 0.01 * float(ips)
    assert by_tag["rank1/ips"][i][1] > 0
eval_lines = re.findall(r"\[Eval\]\[Epoch \d+\]\[Avg\] loss: ([\d.]+), top1: ([\d.]+), top5: ([\d.]+)", log)
assert len(eval_lines) == 2, eval_lines
for i, (loss, top1, top5) in enumerate(eval_lines):
    assert abs(by_tag["eval/loss"][i][1] - float(loss)) < 1e-5
    assert abs(by_tag["eval/top1"][i][1] - float(top1)) < 1e-5
    assert abs(by_tag["eval/top5"][i][1] - float(top5)) < 1e-5
print("2-rank event file: %d scalars, tags and values match the log" % len(events))
PY

# 2. --tensorboard alone writes into output/tb under the working directory.
mkdir -p "$work/cwd"
(cd "$work/cwd" && "$train" "${common[@]}" --limit-train 256 --epochs 1 --tensorboard >"$work/bare.out")
ls "$work/cwd/output/tb"/events.out.tfevents.* >/dev/null \
  || { echo "--tensorboard alone wrote nothing under output/tb"; cat "$work/bare.out"; exit 1; }

# 3. A run killed after step 10 (SIGKILL): what was flushed at the last log line (step 8) is
#    there; a record torn by the kill is skipped, not fatal. A resumed run adds its own file.
set +e
DPAR_TEST_DIE_AT_STEP=10 "$train" "${common[@]}" --limit-train 1024 --tensorboard "$work/killed" \
  --checkpoint-dir "$work/ckpt1" --step-interval 4 >"$work/killed.out" 2>&1
code=$?
set -e
[ "$code" -eq 137 ] || { echo "the killed run exited $code, expected 137"; cat "$work/killed.out"; exit 1; }
killed_file=$(ls "$work/killed"/events.out.tfevents.*)
cp "$killed_file" "$work/killed_before"
"$train" "${common[@]}" --limit-train 1024 --tensorboard "$work/killed" \
  --checkpoint-dir "$work/ckpt1" --resume auto >"$work/resumed.out" 2>&1 \
  || { cat "$work/resumed.out"; exit 1; }
cmp "$killed_file" "$work/killed_before" || { echo "the resumed run changed the old event file"; exit 1; }
[ "$(ls "$work/killed"/events.out.tfevents.* | wc -l)" -eq 2 ] || { echo "expected 2 event files"; exit 1; }
# Tear the old file's last record as a kill mid-write would.
size=$(stat -c %s "$killed_file")
head -c $((size - 7)) "$work/killed_before" >"$killed_file"
new_file=$(ls "$work/killed"/events.out.tfevents.* | grep -vxF "$killed_file")
"$python" - "$src/scripts" "$killed_file" "$new_file" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import tb_events
old, new = sys.argv[2], sys.argv[3]
events, problems = tb_events.read_events(old)
loss_steps = [s for _, s, tag, _ in events if tag == "train/loss"]
assert loss_steps == [4], loss_steps          # step 8's record was torn
assert len(problems) == 1, problems
events, problems = tb_events.read_events(new)
assert not problems, problems
loss_steps = [s for _, s, tag, _ in events if tag == "train/loss"]
# One process: 16 steps per epoch; resumed from step 8's checkpoint, it logs 12..32.
assert loss_steps == [12, 16, 20, 24, 28, 32], loss_steps
print("killed run: torn last record skipped; resumed run wrote a second file")
PY

# 4. The run drawn as one PNG.
"$python" "$src/scripts/plot_run.py" "$work/tb" -o "$work/run.png" >"$work/plot.out" \
  || { cat "$work/plot.out"; exit 1; }
head -c 8 "$work/run.png" | od -An -c | grep -q "P   N   G" || { echo "run.png is not a PNG"; exit 1; }
grep -q "plot_run: wrote $work/run.png" "$work/plot.out" || { cat "$work/plot.out"; exit 1; }
# 5. Progress lines: on a terminal (script(1) gives the program one) evaluation and checkpoint
#    writing rewrite a progress line; into a log file the short ones print nothing extra.
script -qec "$(printf '%q ' "$train" "${common[@]}" --limit-train 256 --limit-val 2000 --epochs 1 \
  --checkpoint-dir "$work/ckpt_tty")" /dev/null >"$work/tty.out"
grep -q $'\reval: 100% (2000/2000 images), .* images/s, .* s\x1b\[K' "$work/tty.out" \
  || { echo "no eval progress line on a terminal"; cat -v "$work/tty.out"; exit 1; }
grep -q $'\rcheckpoint: 100% (.* MB), .* MB/s, .* s\x1b\[K' "$work/tty.out" \
  || { echo "no checkpoint progress line on a terminal"; cat -v "$work/tty.out"; exit 1; }
if grep -q "eval: \|checkpoint: " "$work/log/workerlog.0"; then
  echo "short work printed progress lines into the log"; exit 1
fi
echo "tensorboard event files: 2 ranks, bare flag, killed and resumed runs, plot, progress: ok"
