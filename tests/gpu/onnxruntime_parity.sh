#!/usr/bin/env bash
# GPU inference of an exported model against onnxruntime: test_cuda_infer leaves the model, an
# input and dpar's CPU and GPU outputs in a folder, onnxruntime_parity.py runs onnxruntime on
# them (the Python that holds it: DPAR_PEER_PYTHON, else python3; with the machine's own loader
# path DPAR_PEER_LD_LIBRARY_PATH where scripts/gpu-run.sh set it).
#   onnxruntime_parity.sh <test_cuda_infer>
# Without a GPU: skipped (the test's marker), or a failure under DPAR_GPU_REQUIRED=1.
set -u
test_program=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
DPAR_INFER_PARITY_DIR=$work "$test_program" "an exported MobileNetV3-small runs on the GPU like on the CPU" \
  >"$work/test.txt" 2>&1
rc=$?
cat "$work/test.txt"
if grep -q "dpar-gpu-test-skipped" "$work/test.txt"; then exit 0; fi
[ "$rc" = 0 ] || { echo "FAIL: test_cuda_infer exited $rc"; exit 1; }
python=${DPAR_PEER_PYTHON:-python3}
if [ -n "${DPAR_PEER_LD_LIBRARY_PATH+x}" ]; then
  LD_LIBRARY_PATH=$DPAR_PEER_LD_LIBRARY_PATH "$python" "$here/onnxruntime_parity.py" "$work"
else
  "$python" "$here/onnxruntime_parity.py" "$work"
fi
