#!/usr/bin/env bash
# Builds dpar for the GPU machine (Hopper, sm_90) here and packs what that machine lacks into
# one compressed file of at most 64 MiB: the binaries, the GPU tests with their ctest files,
# and the non-CUDA shared libraries they link (oneDNN, gRPC, protobuf, abseil, gloo, ONNX,
# image codecs...; ldd tells which). The CUDA runtime, cuBLAS, cuDNN and NCCL are NOT packed:
# scripts/gpu-run.sh takes them from the GPU machine's PyTorch wheels (nvidia/*/lib).
#
#   scripts/gpu-bundle.sh [OUT]          build in build-gpu (CUDA arch 90) and pack to OUT
#                                        (default gpu-bundle/dpar-gpu.tar.gz)
#   DPAR_GPU_BUILD_DIR=build scripts/gpu-bundle.sh --no-build [OUT]
#                                        pack an existing CUDA build as it is
# Then: carry the folder holding OUT (and scripts/) to the GPU machine and run
#   scripts/gpu-run.sh gpu-bundle/dpar-gpu.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
build_first=1
if [ "${1:-}" = "--no-build" ]; then build_first=0; shift; fi
out=${1:-gpu-bundle/dpar-gpu.tar.gz}
build=${DPAR_GPU_BUILD_DIR:-build-gpu}
limit=$((64 * 1024 * 1024))

if [ "$build_first" = 1 ]; then
  scripts/bootstrap.sh
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
  # dpar::torch stays out: here it would link Debian's CPU-only libtorch, and the GPU machine's
  # libtorch (PyTorch's CUDA wheel) is not here to build against.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDPAR_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDPAR_WITH_TORCH=OFF
  cmake --build "$build" -j "${DPAR_JOBS:-$(nproc)}"
fi
if [ ! -f "$build/tests/gpu/CTestTestfile.cmake" ]; then
  echo "gpu-bundle: $build is not a CUDA build (no tests/gpu); build with DPAR_WITH_CUDA=ON" >&2
  exit 1
fi
# Absolute: ldd prints a library found through a relative LD_LIBRARY_PATH entry as a relative
# path, which the library scan below would miss (libdpar itself, once).
build=$(cd "$build" && pwd)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/dpar-gpu
mkdir -p "$root/lib" "$root/bin"

# Executables, kept at their place in the build tree so that ctest's files find them (and the
# TIPC scripts, through DPAR_BUILD_DIR).
binaries=()
while IFS= read -r f; do binaries+=("$f"); done < <(
  cd "$build" && find tests/gpu tests/multiproc examples/mobilenetv3 launch bench -maxdepth 1 \
    -type f -perm -u+x \( -name 'test_*' -o -name train -o -name infer -o -name export_model \
    -o -name dpar-launch -o -name 'bench_*' -o -name '*_worker' \) 2>/dev/null | sort |
    # Programs of dpar::torch (bench_torch_ddp) link this machine's CPU-only libtorch: not for
    # the GPU machine (see the configure above), and hundreds of MB of libraries. (grep reads
    # all of ldd's output: with -q it could exit first, and under pipefail ldd's SIGPIPE would
    # make the pipeline fail and let the program in.)
    while IFS= read -r b; do
      if ! ldd "$b" 2>/dev/null | grep 'libtorch' >/dev/null; then echo "$b"; fi
    done)
[ "${#binaries[@]}" -gt 0 ] || { echo "gpu-bundle: no binaries in $build" >&2; exit 1; }
for f in "${binaries[@]}"; do
  mkdir -p "$root/$(dirname "$f")"
  cp "$build/$f" "$root/$f"
  strip --strip-unneeded "$root/$f" 2>/dev/null || true
done
# ctest files of the GPU tests (catch_discover_tests writes *_tests.cmake beside them), and a
# top-level file that includes only that folder.
cp "$build"/tests/gpu/*.cmake "$root/tests/gpu/"
rm -f "$root/tests/gpu/cmake_install.cmake"
echo 'subdirs("tests/gpu")' >"$root/CTestTestfile.cmake"
echo "$(cd "$build" && pwd)" >"$root/BUILD_DIR"
# The scripts the GPU tests run from the source tree (multi-process drills) and the benchmarks'
# PyTorch peers; gpu-run.sh points the ctest files at this copy (SOURCE_DIR), and the
# benchmarks find bench/peers relative to the bundle folder they run in.
mkdir -p "$root/src/tests/gpu" "$root/src/tests/multiproc" "$root/src/tests/launch" "$root/bench"
cp tests/gpu/gpu_mp.sh tests/gpu/onnxruntime_parity.sh tests/gpu/onnxruntime_parity.py \
  "$root/src/tests/gpu/"
cp tests/multiproc/mp_cases.sh "$root/src/tests/multiproc/"
cp tests/launch/common.sh tests/launch/checks.sh "$root/src/tests/launch/"
# Sourced by tests/launch/common.sh (the drills) and the TIPC chain.
cp tests/port_block.sh "$root/src/tests/"
cp -r bench/peers "$root/bench/"
# The TIPC chain (scripts, params files, expected results) with its lite data made here: the
# GPU machine has no Fashion-MNIST. Run there with DPAR_BUILD_DIR=<bundle root>.
tipc=examples/mobilenetv3/test_tipc
DPAR_BUILD_DIR=$build "$tipc/prepare.sh" "$tipc/configs/mobilenet_v3_small/train_infer_gpu.txt" \
  lite_train_lite_infer >/dev/null
mkdir -p "$root/src/$tipc/data"
cp "$tipc"/*.sh "$root/src/$tipc/"
cp -r "$tipc/configs" "$tipc/results" "$root/src/$tipc/"
cp -r "$tipc/data/lite" "$root/src/$tipc/data/"
pwd >"$root/SOURCE_DIR"

# Shared libraries: libdpar, its CUDA backend libdpar_cuda (which libdpar opens at run time,
# beside itself, so no ldd sees it from most binaries), and everything they link that is
# neither part of the C library nor CUDA's (those come from the GPU machine).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libutil\.|libresolv\.|libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver)'
for f in "${binaries[@]}" lib/libdpar_cuda.so.0; do
  LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}" ldd "$build/$f" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  [ -f "$path" ] || { echo "gpu-bundle: $name resolves to $path, not a file" >&2; exit 1; }
  if [[ "$name" =~ $skip ]]; then continue; fi
  [ -e "$root/lib/$name" ] && continue
  cp -L "$path" "$root/lib/$name"
  strip --strip-unneeded "$root/lib/$name" 2>/dev/null || true
done
[ -e "$root/lib/libdpar_cuda.so.0" ] || cp -L "$build/lib/libdpar_cuda.so.0" "$root/lib/"
for lib in libdpar.so.0 libdpar_cuda.so.0; do
  [ -e "$root/lib/$lib" ] || { echo "gpu-bundle: $lib was not packed" >&2; exit 1; }
done
cp scripts/gpu-run.sh scripts/gpu-probe.sh scripts/gpu-call.sh scripts/ncu-kernels.py "$root/"

mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - dpar-gpu | xz -T0 -6 >"$out"
size=$(stat -c %s "$out")
echo "gpu-bundle: $out: $((size / 1024 / 1024)) MiB ($size bytes), ${#binaries[@]} binaries, $(ls "$root/lib" | wc -l) libraries"
if [ "$size" -gt "$limit" ]; then
  echo "gpu-bundle: $out is larger than the 64 MiB the GPU machine accepts" >&2
  exit 1
fi
