#pragma once
// Fashion-MNIST as a torch::data dataset: the idx files (gzip or plain; Debian's
// dataset-fashion-mnist by default) read by dpar's reader, padded to 32x32 and normalised with
// Fashion-MNIST's statistics, held in memory as one [N,1,32,32] tensor.
#include <torch/torch.h>

#include <string>

#include "dpar/data/dataset.h"

namespace libtorch_example {

class FashionMnist : public torch::data::datasets::Dataset<FashionMnist> {
 public:
  FashionMnist(const std::string& dir, bool train, size_t limit = 0) {
    const dpar::data::FashionMnist raw(
        dir, train ? dpar::data::Split::Train : dpar::data::Split::Test, {}, limit);
    const int64_t n = static_cast<int64_t>(raw.size());
    images_ = torch::zeros({n, 1, 32, 32});
    labels_ = torch::empty({n}, torch::kLong);
    auto pixels = images_.accessor<float, 4>();
    auto labels = labels_.accessor<int64_t, 1>();
    for (int64_t i = 0; i < n; ++i) {
      const dpar::data::Image image = raw.image(static_cast<size_t>(i));
      for (int64_t y = 0; y < 28; ++y) {
        for (int64_t x = 0; x < 28; ++x) {
          pixels[i][0][y + 2][x + 2] = static_cast<float>(image.pixels[y * 28 + x]) / 255.f;
        }
      }
      labels[i] = raw.label(static_cast<size_t>(i));
    }
    images_ = (images_ - 0.2860f) / 0.3530f;
  }
  torch::data::Example<> get(size_t index) override {
    return {images_[static_cast<int64_t>(index)], labels_[static_cast<int64_t>(index)]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(labels_.size(0)); }
  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }

 private:
  torch::Tensor images_, labels_;
};

}  // namespace libtorch_example
