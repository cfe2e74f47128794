#!/usr/bin/env bash
# Installs every dependency of dpar from Debian's archive, and bench_infer's onnxruntime peer
# from the npm registry. Idempotent: what is already present is skipped, so test.sh and demo.sh
# can call it on every run cheaply.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  libdnnl-dev opencl-headers ocl-icd-opencl-dev libeigen3-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libgloo-dev
  libisal-dev
  catch2
  libonnx-dev
  libjpeg-dev libpng-dev libstb-dev zlib1g-dev
  nlohmann-json3-dev
  dataset-fashion-mnist
  iproute2 procps
  # Elastic jobs' etcd rendezvous (--rdzv_backend=etcd): the tests start real etcd members.
  etcd-server etcd-client
  # scripts/fuzz.sh: Clang with libFuzzer (compiler-rt) and its OpenMP runtime; llvm brings
  # llvm-symbolizer, which turns sanitizer reports' addresses into file:line.
  clang libclang-rt-14-dev libomp-14-dev llvm
  # libtorch (C++ API, 1.13) for dpar::torch, its example, tests and benchmark.
  libtorch-dev
  python3 python3-numpy python3-torch python3-torchvision python3-onnx
  python3-protobuf python3-crc32c python3-matplotlib
  # The PyTorch peers' BLAS: Debian's python3-torch calls whatever libblas.so.3 is selected,
  # and without this it is the reference BLAS (~5 GFLOPS, 10x below OpenBLAS), which would
  # make every benchmark ratio against PyTorch's linear layers meaningless.
  libopenblas0-openmp
  # bench_allreduce's Open MPI peer (its shared-memory MPI_Allreduce, under mpirun).
  openmpi-bin libopenmpi-dev
  # bench_infer's onnxruntime peer runs on Node.js (onnxruntime-node, installed below); npm
  # comes with it where nodejs is NodeSource's, else from Debian's npm package.
  nodejs
)

command -v npm > /dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#packages[@]} packages present"
else
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "bootstrap: done"
fi

# onnxruntime (CPU) for bench_infer's peer: the npm package onnxruntime-node carries the
# onnxruntime C library inside it, so --ignore-scripts skips only its optional GPU download.
# bench_infer looks in the same place; a failed install is reported and the benchmark runs
# without that peer, so nothing else depends on the registry being reachable.
ort_version=1.30.0
ort_dir="${DPAR_ORT_NODE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dpar/onnxruntime-node}"
ort_package="$ort_dir/node_modules/onnxruntime-node/package.json"
if ! grep -q "\"version\": \"$ort_version\"" "$ort_package" 2>/dev/null; then
  mkdir -p "$ort_dir"
  if npm install --prefix "$ort_dir" --ignore-scripts --no-audit --no-fund --loglevel=error \
      "onnxruntime-node@$ort_version" > "$ort_dir/npm-install.log" 2>&1; then
    echo "bootstrap: onnxruntime-node $ort_version installed in $ort_dir"
  else
    echo "bootstrap: warning: onnxruntime-node not installed (see $ort_dir/npm-install.log);" \
      "bench_infer will run without its onnxruntime peer"
  fi
fi
