#!/usr/bin/env bash
# Every test, from a fresh machine: dependencies, configure, build, ctest.
#   scripts/test.sh            full build (CUDA sources compile when the toolkit is present)
#                              and every test, then a CPU-only build with its unit tests
#   scripts/test.sh --sanitize address|thread [--labels REGEX]
#                              a CPU-only build instrumented with ASan+LeakSanitizer+UBSan
#                              (address) or ThreadSanitizer (thread), in its own folder, and
#                              the tests whose ctest label matches REGEX under it (default:
#                              every label but gpu and install); docs/reliability.md
# Environment: DPAR_BUILD_DIR (default build), DPAR_JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
labels=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=${2:?--sanitize needs address or thread}; shift 2 ;;
    --labels) labels=${2:?--labels needs a ctest label regex}; shift 2 ;;
    *) echo "test.sh: unknown argument '$1' (--sanitize address|thread, --labels REGEX)" >&2; exit 2 ;;
  esac
done
[ -z "$labels" ] || [ -n "$sanitize" ] || { echo "test.sh: --labels goes with --sanitize" >&2; exit 2; }

scripts/bootstrap.sh

build=${DPAR_BUILD_DIR:-build}
jobs=${DPAR_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

if [ -n "$sanitize" ]; then
  case "$sanitize" in
    address) flags=address,undefined; dir=$build-asan ;;
    thread) flags=thread; dir=$build-tsan ;;
    *) echo "test.sh: --sanitize takes address or thread, not '$sanitize'" >&2; exit 2 ;;
  esac
  echo "== configure + build ($dir, DPAR_SANITIZE=$flags)"
  # CPU-only: device code is checked by compute-sanitizer on a GPU machine (docs/gpu.md).
  # No -Werror: GCC's flow warnings change under instrumentation; the plain build keeps them.
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDPAR_WITH_CUDA=OFF \
    -DDPAR_BUILD_BENCH=OFF -DDPAR_SANITIZE="$flags"
  cmake --build "$dir" -j "$jobs"
  source tests/sanitizers/options.sh
  echo "== tests under $flags (labels: ${labels:-all but gpu and install})"
  if [ -n "$labels" ]; then
    ctest --test-dir "$dir" -j "$jobs" --output-on-failure --timeout 1200 -L "$labels"
  else
    ctest --test-dir "$dir" -j "$jobs" --output-on-failure --timeout 1200 -LE '^(gpu|install)$'
  fi
  exit 0
fi

echo "== configure + build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDPAR_WERROR=ON
cmake --build "$build" -j "$jobs"

echo "== tests"
ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 600

# The CPU-only configuration must build and pass on its own too (dpar::torch has no CUDA
# code of its own, and the full build above tests it).
echo "== CPU-only build (DPAR_WITH_CUDA=OFF)"
cmake -S . -B "$build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDPAR_WERROR=ON \
  -DDPAR_WITH_CUDA=OFF -DDPAR_WITH_TORCH=OFF -DDPAR_BUILD_BENCH=OFF
cmake --build "$build-cpu" -j "$jobs"
ctest --test-dir "$build-cpu" -j "$jobs" --output-on-failure --timeout 600 -L unit

# A CPU run of the CUDA build has the CPU-only build's footprint: libdpar opens its CUDA backend
# (libdpar_cuda: cuBLAS, cuDNN, NCCL) only when a CUDA device is first used.
if [ -e "$build/lib/libdpar_cuda.so" ]; then
  echo "== footprint of a CPU run: CUDA build vs CPU-only build"
  /usr/bin/python3 tests/footprint/cpu_run_footprint.py "$build" "$build-cpu"
fi
