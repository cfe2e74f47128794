#!/usr/bin/env bash
# Time to 90% test top-1 on full Fashion-MNIST (32x32), 2 ranks x 1 thread: dpar's train under
# dpar-launch beside PyTorch DDP (bench/peers/torch_ddp_fmnist.py) with the same recipe, in one
# invocation. Prints each framework's per-epoch accuracy, the time to the target and the ratio.
#   bench/time_to_accuracy.sh [build dir] [epochs]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
epochs=${2:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/launch/dpar-launch" --nproc_per_node=2 --start_port=$((26000 + RANDOM % 2000 * 2)) \
  --log_dir="$work/log" "$build/examples/mobilenetv3/train" --epochs "$epochs" --batch-size 64 \
  --lr 0.1 --img-size 32 --print-freq 100000 --threads 1 >/dev/null 2>&1
dpar_line=$(grep -m1 -E '^\[Eval\]\[Epoch [0-9]+\]\[Avg\] .*top1: (0\.9|1\.0)' "$work/log/workerlog.0" || true)
grep -E '^\[Eval\]' "$work/log/workerlog.0" | sed 's/^/[dpar] /'
dpar_s=$(echo "$dpar_line" | sed -n 's/.*elapsed \([0-9.]*\) s.*/\1/p')

OMP_NUM_THREADS=1 /usr/bin/python3 "$here/peers/torch_ddp_fmnist.py" --epochs "$epochs" >"$work/torch.txt" 2>/dev/null
grep '^\[torch\]' "$work/torch.txt"
torch_s=$(tail -1 "$work/torch.txt" | /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["seconds_to_target"] or "")')

echo "time to 90% top-1, 2 ranks x 1 thread, batch 64 per rank:"
echo "  dpar    ${dpar_s:-not reached in $epochs epochs} s"
echo "  pytorch ${torch_s:-not reached in $epochs epochs} s"
if [ -n "$dpar_s" ] && [ -n "$torch_s" ]; then
  /usr/bin/python3 -c "print(f'  ratio pytorch/dpar (speed-up): {$torch_s/$dpar_s:.2f}x')"
fi
