#!/usr/bin/env bash
# Installs the built tree into a scratch prefix and builds outside projects against it with
# find_package(dpar CONFIG): the tiny consumer, and the README's "Your own model" program
# (extracted from README.md), which then runs as a user would: one process, a second run into
# the same checkpoint folder (refused), --resume, and two ranks under the installed dpar-launch.
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
export LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}"
cmake -S "$source_dir/tests/install/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"

# The README's program, between its markers.
mkdir -p "$work/own"
sed -n '/<!-- own-program:begin -->/,/<!-- own-program:end -->/p' "$source_dir/README.md" |
  sed '1,2d;$d' | sed '$d' >"$work/own/main.cpp"
grep -q "int main" "$work/own/main.cpp" || { echo "no program between the README's markers"; exit 1; }
cat >"$work/own/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(own_model LANGUAGES CXX)
find_package(dpar CONFIG REQUIRED)
add_executable(own_model main.cpp)
target_link_libraries(own_model PRIVATE dpar::dpar)
CMAKE
cmake -S "$work/own" -B "$work/own/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/own/build" >/dev/null
own=$work/own/build/own_model
fail() { echo "FAIL: $*"; exit 1; }
cd "$work"

"$own" --epochs 1 --limit 512 --out ck >one.txt 2>&1 || { cat one.txt; fail "single process"; }
grep -q "^epoch 0: mean loss" one.txt && grep -q "^top-1 on 1000 test images" one.txt ||
  { cat one.txt; fail "single-process output"; }
if "$own" --epochs 1 --limit 512 --out ck >again.txt 2>&1; then fail "a second run into ck was not refused"; fi
grep -q "already holds 2 checkpoint(s) of an earlier run" again.txt || { cat again.txt; fail "refusal text"; }
"$own" --epochs 2 --limit 512 --out ck --resume >resume.txt 2>&1 || { cat resume.txt; fail "--resume"; }
grep -q "^epoch 1: mean loss" resume.txt && ! grep -q "^epoch 0" resume.txt ||
  { cat resume.txt; fail "--resume did not continue at epoch 1"; }

source "$source_dir/tests/port_block.sh"
take_port_block
"$work/prefix/bin/dpar-launch" --nproc_per_node=2 --start_port=$port --log_dir=logs \
  "$own" --epochs 1 --limit 512 --out ck2 >launch.txt 2>&1 || { cat launch.txt logs/*; fail "2 ranks"; }
grep -q "^epoch 0: mean loss" launch.txt && grep -q "DataParallel: all_reduce tensors" launch.txt ||
  { cat launch.txt; fail "2-rank output"; }
echo "own model: single process, refused re-run, --resume and 2 ranks under dpar-launch: ok"

# dpar::torch, when this build has it: examples/libtorch built against the installed package
# with find_package(dpar COMPONENTS torch), as docs/libtorch.md tells a libtorch user to.
if [ -f "$work/prefix/lib/cmake/dpar/dparTorchTargets.cmake" ]; then
  mkdir -p "$work/torch_user"
  cp "$source_dir"/examples/libtorch/*.cpp "$source_dir"/examples/libtorch/*.h "$work/torch_user/"
  cat >"$work/torch_user/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(torch_user LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(dpar CONFIG REQUIRED COMPONENTS torch)
add_executable(train_resnet18 train.cpp)
target_link_libraries(train_resnet18 PRIVATE dpar::torch)
CMAKE
  cmake -S "$work/torch_user" -B "$work/torch_user/build" -G Ninja \
    -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
  cmake --build "$work/torch_user/build" >/dev/null
  "$work/prefix/bin/dpar-launch" --nproc_per_node=2 --start_port=$((port + 10)) --log_dir=tlogs \
    "$work/torch_user/build/train_resnet18" --epochs 1 --limit 128 --batch_size 32 \
    --output_dir torch_out >torch.txt 2>&1 || { cat torch.txt tlogs/*; fail "libtorch example"; }
  grep -q "after fusion: 3 buckets" torch.txt && [ -s torch_out/resnet18.ckpt ] ||
    { cat torch.txt; fail "libtorch example output"; }
  echo "libtorch example against the installed dpar::torch, 2 ranks: ok"
fi
