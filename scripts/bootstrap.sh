#!/usr/bin/env bash
# Installs every dependency of dpar from Debian's archive. Idempotent: packages already
# present are skipped, so test.sh and demo.sh can call it on every run cheaply.
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
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#packages[@]} packages present"
  exit 0
fi

echo "bootstrap: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "bootstrap: done"
