#pragma once
// Datasets: indexable collections of (image tensor, label) examples. get() must be safe to call
// from several threads at once (the DataLoader's workers); all randomness comes from the
// Generator passed in, so an example is a pure function of (index, generator state).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpar/core/random.h"
#include "dpar/data/image.h"
#include "dpar/data/transforms.h"
#include "dpar/tensor/tensor.h"

namespace dpar::data {

struct Example {
  Tensor image;  // f32 [3,H,W] after the dataset's transform
  int64_t label = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual Example get(size_t index, Generator& rng) const = 0;
  virtual std::vector<std::string> class_names() const = 0;
};

enum class Split { Train, Test };

// Fashion-MNIST from its idx files (train-images-idx3-ubyte[.gz], ...; gzip or plain) in dir:
// 60000 train / 10000 test 28x28 grey images, 10 classes. The whole split is loaded into
// memory at construction (47 MB for train). limit > 0 keeps only the first limit examples.
// The default transform gives 3 ImageNet-normalised channels (for ImageNet-shaped models);
// pass FashionMnist::transform() for [1,28,28] images normalised with Fashion-MNIST's own
// statistics.
class FashionMnist : public Dataset {
 public:
  static constexpr const char* kDebianDir = "/usr/share/datasets/fashion-mnist";
  // One channel, (x / 255 - 0.2860) / 0.3530, after the given image steps (e.g. a flip).
  static Compose transform(std::vector<std::shared_ptr<const Transform>> steps = {});

  FashionMnist(const std::string& dir, Split split, Compose transform = Compose(),
               size_t limit = 0);
  size_t size() const override { return labels_.size(); }
  Example get(size_t index, Generator& rng) const override;
  std::vector<std::string> class_names() const override;

  // The raw 28x28 grey image and its label (e.g. for writing image-folder subsets).
  Image image(size_t index) const;
  int64_t label(size_t index) const;

 private:
  int64_t rows_ = 0, cols_ = 0;
  std::vector<uint8_t> pixels_;  // size() x rows x cols
  std::vector<uint8_t> labels_;
  Compose transform_;
};

// The ImageNet folder layout: dir/<class>/<image>.{jpg,jpeg,png} (extensions in any case).
// Classes are the sub-folders sorted by name (labels 0..K-1 in that order), images sorted by
// file name within a class. Pass root/train or root/val as dir. Throws dpar::Error for a
// missing folder, one without class folders, and a class folder without images (naming it).
class ImageFolder : public Dataset {
 public:
  explicit ImageFolder(const std::string& dir, Compose transform = Compose());
  size_t size() const override { return samples_.size(); }
  // Reads and decodes the file; an unreadable or corrupt image throws a dpar::Error naming it.
  Example get(size_t index, Generator& rng) const override;
  std::vector<std::string> class_names() const override { return classes_; }

  const std::string& path(size_t index) const;
  int64_t label(size_t index) const;

 private:
  std::string dir_;
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int64_t>> samples_;  // (path, label)
  Compose transform_;
};

// A view of another dataset restricted to some of its indices (in the given order).
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> base, std::vector<size_t> indices);
  size_t size() const override { return indices_.size(); }
  Example get(size_t index, Generator& rng) const override;
  std::vector<std::string> class_names() const override { return base_->class_names(); }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<size_t> indices_;
};

}  // namespace dpar::data
