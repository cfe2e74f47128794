#!/usr/bin/env bash
# Prepares the data of the test chain:
#   prepare.sh <params file> lite_train_lite_infer
#       data/lite: 16 train + 16 val JPEG images (4 Fashion-MNIST classes x 4, ImageNet folder
#       layout train/<class>/*.jpg, val/<class>/*.jpg), the val images once more in the flat
#       folder infer/ (for the inference program) and demo.jpg (a test image in neither split)
#   prepare.sh <params file> whole_train_whole_infer
#       the lite data (its infer/ images and demo.jpg are the inference inputs) and
#       data/fashion-mnist: a link to the whole of Fashion-MNIST as idx files (60000 train /
#       10000 test images), which the training program reads directly
# The params file is checked first (an unknown key stops here, before anything is written).
# Needs only the build: make_lite_data writes the JPEG files. Environment: DPAR_BUILD_DIR
# (default <repo>/build), DPAR_FASHION_MNIST (default /usr/share/datasets/fashion-mnist).
set -euo pipefail
TIPC_PROG=prepare.sh
tipc_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$tipc_dir/../../.." && pwd)
# shellcheck source=common_func.sh
source "$tipc_dir/common_func.sh"

tipc_start "$@"
make_lite_data=$(tipc_program make_lite_data) || exit 1

source_dir=${DPAR_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
  t10k-labels-idx1-ubyte; do
  [ -e "$source_dir/$f" ] || [ -e "$source_dir/$f.gz" ] ||
    tipc_die "Fashion-MNIST not found: $source_dir/$f(.gz) is missing (install Debian's dataset-fashion-mnist, or set DPAR_FASHION_MNIST to the folder with the idx files)"
done

cd "$tipc_dir"
mkdir -p data
# One prepare at a time (ctest runs several chains at once); the lite set is written to a
# temporary folder and renamed into place, so an interrupted run never leaves a half-written
# data/lite. The stamp records how it was made: other settings mean a rebuild.
exec 9>data/.prepare.lock
flock 9
lite_args=(--fashion-mnist "$source_dir" --classes "0,1,7,8" --per-class 4)
stamp="make_lite_data ${lite_args[*]}"
if [ -f data/lite/stamp.txt ] && [ "$(cat data/lite/stamp.txt)" = "$stamp" ]; then
  echo "prepare.sh: data/lite is up to date"
else
  tmp=data/.lite.tmp.$$
  rm -rf "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  "$make_lite_data" "${lite_args[@]}" --output "$tmp"
  echo "$stamp" >"$tmp/stamp.txt"
  rm -rf data/lite
  mv -T "$tmp" data/lite
fi
echo "prepare.sh: lite data in $tipc_dir/data/lite: $(find data/lite/train -name '*.jpg' | wc -l) train," \
  "$(find data/lite/val -name '*.jpg' | wc -l) val images, $(wc -l <data/lite/labels.txt) classes," \
  "infer/ and demo.jpg"

if [ "$mode" = whole_train_whole_infer ]; then
  ln -sfn "$source_dir" data/fashion-mnist
  echo "prepare.sh: whole data: data/fashion-mnist -> $source_dir (Fashion-MNIST idx files," \
    "60000 train / 10000 test images)"
fi
