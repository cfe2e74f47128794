#!/usr/bin/env bash
# On the GPU machine: unpacks a bundle made by scripts/gpu-bundle.sh, points the loader at its
# libraries and at the CUDA libraries of that machine's PyTorch wheels (nvidia/*/lib), then
# runs the GPU tests (`ctest -L gpu`) and, when given, one command with that environment.
#
#   scripts/gpu-run.sh BUNDLE [DIR]                 unpack to DIR (default /tmp/dpar-gpu), test
#   scripts/gpu-run.sh BUNDLE DIR -- CMD ARGS...    ... then run CMD (e.g. bin paths under DIR)
#   DPAR_GPU_SKIP_TESTS=1 scripts/gpu-run.sh ...    run only CMD
#   DPAR_GPU_SKIP_TESTS=1 scripts/gpu-run.sh BUNDLE DIR -- ./gpu-probe.sh OUT   the staged probe
# Exit status: the tests' (and CMD's) failure, non-zero when anything failed.
set -uo pipefail
bundle=${1:?usage: gpu-run.sh BUNDLE [DIR] [-- CMD ARGS...]}
shift
dir=/tmp/dpar-gpu
if [ $# -gt 0 ] && [ "$1" != "--" ]; then dir=$1; shift; fi
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-python3}

rm -rf "$dir"
mkdir -p "$dir"
# tarfile reads xz without the xz tool, which a minimal image may lack.
"$python" - "$bundle" "$dir" <<'PY' || { echo "gpu-run: cannot unpack $bundle" >&2; exit 1; }
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2])
PY
root=$dir/dpar-gpu
# ctest's files name the build folder of the machine that built them; point them here.
# Build folder first: it may lie inside the source folder.
old=$(cat "$root/BUILD_DIR")
find "$root" -name '*.cmake' -exec sed -i "s#$old#$root#g" {} +
if [ -f "$root/SOURCE_DIR" ]; then
  old_src=$(cat "$root/SOURCE_DIR")
  find "$root" -name '*.cmake' -exec sed -i "s#$old_src/#$root/src/#g" {} +
fi

# CUDA runtime, cuBLAS(Lt), cuDNN and NCCL from PyTorch's wheels.
cuda_libs=$("$python" - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "**", "lib", "*.so*"), recursive=True)})
print(":".join(dirs))
PY
)
# The benchmarks' PyTorch peers run with the machine's own loader path (bench_util.h), not with
# the bundle's Debian libstdc++/libssl/libz first.
export DPAR_PEER_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
# ... and with the Python that holds PyTorch (the one whose nvidia wheels are used above), not
# the system's /usr/bin/python3, which the benchmarks would otherwise prefer.
DPAR_PEER_PYTHON=${DPAR_PEER_PYTHON:-$(command -v "$python")}
export DPAR_PEER_PYTHON
export LD_LIBRARY_PATH="$root/lib${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "gpu-run: bundle in $root; CUDA libraries from ${cuda_libs:-nowhere (no nvidia wheels found)}"
# Where nvidia-smi lists a GPU, a GPU test that skips is a failure (tests/gpu/gpu_helpers.h,
# gpu_mp.sh): a run that tested nothing must not pass.
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  export DPAR_GPU_REQUIRED=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi

status=0
if [ "${DPAR_GPU_SKIP_TESTS:-0}" != 1 ]; then
  if command -v ctest >/dev/null; then
    ctest --test-dir "$root" -L gpu --output-on-failure --timeout 600 || status=1
  else
    # No CMake: run each test program directly (each runs all its cases), then the
    # multi-process cases (the list in tests/gpu/CMakeLists.txt).
    for t in "$root"/tests/gpu/test_*; do
      case $t in *.cmake) continue ;; esac
      echo "== $t"; "$t" || status=1
    done
    for c in collectives2 collectives4 gloo_collectives2 gloo_collectives4 ddp ddp_no_sync \
      ddp_unequal ddp_buckets ddp_bf16 gloo_ddp kill9 timeout detail_mismatch; do
      echo "== gpu_mp $c"
      "$root/src/tests/gpu/gpu_mp.sh" "$c" "$root/launch/dpar-launch" \
        "$root/tests/multiproc/collectives_worker" "$root/tests/multiproc/ddp_worker" || status=1
    done
  fi
fi
if [ $# -gt 0 ]; then
  (cd "$root" && "$@") || status=1
fi
exit $status
