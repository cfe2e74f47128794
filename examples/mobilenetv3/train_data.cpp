#include "train_data.h"

#include <filesystem>

#include "dpar/core/error.h"
#include "dpar/data/transforms.h"

namespace fs = std::filesystem;
using namespace dpar;

namespace mobilenetv3 {
namespace {

// Fashion-MNIST is grey, centred and small: no crops, only a flip for training, and its own
// normalisation statistics (mean 0.286, std 0.353 of the pixel values).
constexpr std::array<float, 3> kFashionMean{0.286f, 0.286f, 0.286f};
constexpr std::array<float, 3> kFashionStd{0.353f, 0.353f, 0.353f};

bool has_idx_files(const fs::path& dir) {
  for (const char* name : {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"}) {
    if (fs::exists(dir / name)) return true;
  }
  return false;
}

}  // namespace

DataSplits load_data(const std::string& data_path, int64_t img_size, int64_t limit_train,
                     int64_t limit_val) {
  const fs::path root(data_path);
  DPAR_CHECK(fs::is_directory(root), "data path ", data_path, " is not a directory");
  DataSplits splits;
  if (has_idx_files(root)) {
    splits.kind = "fashion-mnist";
    splits.mean = kFashionMean;
    splits.std = kFashionStd;
    splits.resize_size = img_size;  // resized straight to the model's size, no crop
    const data::ToTensorNormalize norm(kFashionMean, kFashionStd);
    std::vector<std::shared_ptr<const data::Transform>> train_steps{
        std::make_shared<data::Resize>(img_size, img_size),
        std::make_shared<data::RandomHorizontalFlip>(0.5)};
    std::vector<std::shared_ptr<const data::Transform>> val_steps{
        std::make_shared<data::Resize>(img_size, img_size)};
    splits.train = std::make_shared<data::FashionMnist>(data_path, data::Split::Train,
                                                        data::Compose(train_steps, norm),
                                                        static_cast<size_t>(limit_train));
    splits.val = std::make_shared<data::FashionMnist>(data_path, data::Split::Test,
                                                      data::Compose(val_steps, norm),
                                                      static_cast<size_t>(limit_val));
  } else {
    splits.kind = "image-folder";
    DPAR_CHECK(fs::is_directory(root / "train"), "data path ", data_path,
               " has neither Fashion-MNIST idx files nor a train/ folder");
    DPAR_CHECK(fs::is_directory(root / "val"), "data path ", data_path, " has no val/ folder");
    const int64_t resize = img_size * 256 / 224;
    splits.mean = data::ToTensorNormalize::kImageNetMean;
    splits.std = data::ToTensorNormalize::kImageNetStd;
    splits.resize_size = resize;
    auto train = std::make_shared<data::ImageFolder>((root / "train").string(),
                                                     data::imagenet_train_transform(img_size));
    auto val = std::make_shared<data::ImageFolder>((root / "val").string(),
                                                   data::imagenet_eval_transform(img_size, resize));
    DPAR_CHECK(train->class_names() == val->class_names(), "data path ", data_path,
               ": train/ and val/ have different class folders");
    splits.train = train;
    splits.val = val;
    auto first_n = [](std::shared_ptr<const data::Dataset> d,
                      int64_t n) -> std::shared_ptr<const data::Dataset> {
      if (n <= 0 || static_cast<size_t>(n) >= d->size()) return d;
      std::vector<size_t> idx(static_cast<size_t>(n));
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      return std::make_shared<data::Subset>(d, idx);
    };
    splits.train = first_n(splits.train, limit_train);
    splits.val = first_n(splits.val, limit_val);
  }
  DPAR_CHECK(splits.train->size() > 0, "data path ", data_path, ": no training examples");
  DPAR_CHECK(splits.val->size() > 0, "data path ", data_path, ": no validation examples");
  return splits;
}

}  // namespace mobilenetv3
