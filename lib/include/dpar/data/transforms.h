#pragma once
// Image transforms, torchvision-style, on 8-bit HWC images (1 or 3 channels), ending in a
// conversion to a normalised f32 [3,H,W] tensor. Random transforms draw only from the
// Generator they are given (the DataLoader seeds one per sample), never from global state.
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dpar/core/random.h"
#include "dpar/data/image.h"
#include "dpar/tensor/tensor.h"

namespace dpar::data {

class Transform {
 public:
  virtual ~Transform() = default;
  virtual Image operator()(Image image, Generator& rng) const = 0;
};

// Scales so that the shorter side becomes size (the longer side size * long / short, rounded
// down, as torchvision's Resize(int)); or to exactly height x width. Bilinear with
// antialiasing when shrinking (a triangle filter widened by the scale factor, like PIL).
class Resize : public Transform {
 public:
  explicit Resize(int64_t size);
  Resize(int64_t height, int64_t width);
  Image operator()(Image image, Generator& rng) const override;

 private:
  int64_t size_ = 0;  // shorter side, when height_/width_ are 0
  int64_t height_ = 0;
  int64_t width_ = 0;
};

// torchvision's RandomResizedCrop: a crop of random area (a scale fraction of the image) and
// aspect ratio (log-uniform in ratio), 10 tries then a centred fallback, resized to
// size x size.
class RandomResizedCrop : public Transform {
 public:
  explicit RandomResizedCrop(int64_t size, std::pair<double, double> scale = {0.08, 1.0},
                             std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0});
  Image operator()(Image image, Generator& rng) const override;

 private:
  int64_t size_;
  std::pair<double, double> scale_;
  std::pair<double, double> ratio_;
};

// Mirrors left-right with probability p.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Image operator()(Image image, Generator& rng) const override;

 private:
  double p_;
};

// Colour to one grey channel with torchvision's weights (L = 0.299 R + 0.587 G + 0.114 B,
// rounded to the nearest byte); a grey image passes unchanged. For models of 1 channel.
class Grayscale : public Transform {
 public:
  Image operator()(Image image, Generator& rng) const override;
};

// The central size x size window (torchvision's rounding); an image smaller than that is
// padded with zeros first.
class CenterCrop : public Transform {
 public:
  explicit CenterCrop(int64_t size);
  Image operator()(Image image, Generator& rng) const override;

 private:
  int64_t size_;
};

// uint8 HWC -> f32 [3,H,W] contiguous with (x / 255 - mean[c]) / std[c]; grey images are
// replicated to 3 channels. grey() makes [1,H,W] from grey images instead (a colour image is
// then an error), with one mean and std.
class ToTensorNormalize {
 public:
  static constexpr std::array<float, 3> kImageNetMean{0.485f, 0.456f, 0.406f};
  static constexpr std::array<float, 3> kImageNetStd{0.229f, 0.224f, 0.225f};
  // Fashion-MNIST's own statistics (its 60000 training images, pixel values / 255).
  static constexpr float kFashionMnistMean = 0.2860f;
  static constexpr float kFashionMnistStd = 0.3530f;
  explicit ToTensorNormalize(std::array<float, 3> mean = kImageNetMean,
                             std::array<float, 3> std = kImageNetStd);
  static ToTensorNormalize grey(float mean = kFashionMnistMean, float std = kFashionMnistStd);
  Tensor operator()(const Image& image) const;
  int64_t channels() const { return channels_; }

 private:
  std::array<float, 3> mean_;
  std::array<float, 3> inv_std_;
  int64_t channels_ = 3;
};

// Image transforms applied in order, then the tensor conversion.
class Compose {
 public:
  // Just ToTensorNormalize with ImageNet statistics: 3 channels, for ImageNet-pretrained
  // models. Fashion-MNIST models of one's own want FashionMnist::transform() (1 channel, its
  // own statistics).
  Compose() = default;
  explicit Compose(std::vector<std::shared_ptr<const Transform>> steps,
                   ToTensorNormalize to_tensor = ToTensorNormalize());
  Image apply_image(Image image, Generator& rng) const;  // the image steps only
  Tensor operator()(Image image, Generator& rng) const;

 private:
  std::vector<std::shared_ptr<const Transform>> steps_;
  ToTensorNormalize to_tensor_;
};

// The usual ImageNet pipelines: train = RandomResizedCrop(size) + RandomHorizontalFlip;
// eval = Resize(resize) + CenterCrop(size); both end in ToTensorNormalize(ImageNet stats).
Compose imagenet_train_transform(int64_t size = 224);
Compose imagenet_eval_transform(int64_t size = 224, int64_t resize = 256);

// Resamples the window [x0, x0+w) x [y0, y0+h) of image to out_h x out_w (bilinear, with
// antialiasing when shrinking; samples never come from outside the window).
Image resize_window(const Image& image, int64_t x0, int64_t y0, int64_t w, int64_t h, int64_t out_h,
                    int64_t out_w);

}  // namespace dpar::data
