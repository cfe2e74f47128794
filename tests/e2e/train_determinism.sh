#!/usr/bin/env bash
# Same seed and data => bitwise identical loss sequence, run after run (CPU). The loss log
# holds every step's loss as an exact hex float. Also checks that a different seed differs.
set -euo pipefail
train=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--limit-train 256 --limit-val 64 --epochs 2 --batch-size 32 --img-size 32 --threads 2
        --workers 2 --print-freq 4)
"$train" "${common[@]}" --seed 3 --loss-log "$work/a.txt" >"$work/a.out"
"$train" "${common[@]}" --seed 3 --loss-log "$work/b.txt" --workers 0 >"$work/b.out"
"$train" "${common[@]}" --seed 4 --loss-log "$work/c.txt" >"$work/c.out"
steps=$(wc -l <"$work/a.txt")
[ "$steps" -eq 16 ] || { echo "expected 16 logged steps, got $steps"; exit 1; }
cmp "$work/a.txt" "$work/b.txt" || { echo "same seed gave different losses"; diff "$work/a.txt" "$work/b.txt" | head; exit 1; }
if cmp -s "$work/a.txt" "$work/c.txt"; then echo "different seeds gave identical losses"; exit 1; fi
grep -q '^\[Epoch 1, iter: 8\] top1: .*avg_ips: .* images/sec\.$' "$work/a.out" || { echo "log line format"; cat "$work/a.out"; exit 1; }
grep -q '^\[Eval\]\[Epoch 1\]\[Avg\] loss: .*top1: .*top5: ' "$work/a.out" || { echo "eval line format"; exit 1; }
echo "identical losses over $steps steps with seed 3 (workers 2 vs 0); seed 4 differs"
