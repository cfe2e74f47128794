#pragma once
// Data for the MobileNetV3 example: Fashion-MNIST (idx files) or an ImageNet-style folder
// (<root>/train/<class>/*.jpg, <root>/val/...), with the transforms of each split.
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "dpar/data/dataset.h"

namespace mobilenetv3 {

struct DataSplits {
  std::shared_ptr<const dpar::data::Dataset> train;
  std::shared_ptr<const dpar::data::Dataset> val;
  std::string kind;  // "fashion-mnist" or "image-folder"
  // The evaluation preprocessing, recorded in the exported inference model: resize (shorter
  // side) to resize_size, centre-crop to the image size, then (x / 255 - mean) / std.
  std::array<float, 3> mean{}, std{};
  int64_t resize_size = 0;
};

// Picks the format from what is in data_path; limit_* > 0 keeps only the first N examples.
DataSplits load_data(const std::string& data_path, int64_t img_size, int64_t limit_train,
                     int64_t limit_val);

}  // namespace mobilenetv3
