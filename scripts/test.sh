#!/usr/bin/env bash
# Every test, from a fresh machine: dependencies, configure, build, ctest.
#   scripts/test.sh            full build (CUDA sources compile when the toolkit is present)
#                              and every test, then a CPU-only build with its unit tests
# Environment: DPAR_BUILD_DIR (default build), DPAR_JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

build=${DPAR_BUILD_DIR:-build}
jobs=${DPAR_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

echo "== configure + build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDPAR_WERROR=ON
cmake --build "$build" -j "$jobs"

echo "== tests"
ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 600

# The CPU-only configuration must build and pass on its own too.
echo "== CPU-only build (DPAR_WITH_CUDA=OFF)"
cmake -S . -B "$build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDPAR_WERROR=ON \
  -DDPAR_WITH_CUDA=OFF -DDPAR_BUILD_BENCH=OFF
cmake --build "$build-cpu" -j "$jobs"
ctest --test-dir "$build-cpu" -j "$jobs" --output-on-failure --timeout 600 -L unit
