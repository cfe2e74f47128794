// Fashion-MNIST: idx files (big-endian header: magic, dimension sizes; then uint8 data), read
// through zlib so gzipped and plain files both work.
#include <zlib.h>

#include <algorithm>
#include <filesystem>

#include "dpar/data/dataset.h"

namespace dpar::data {
namespace {

// Reads an idx file with the given number of dimensions; returns the sizes and the data.
std::vector<uint8_t> read_idx(const std::string& path, int ndims, std::vector<int64_t>& sizes) {
  gzFile f = gzopen(path.c_str(), "rb");
  DPAR_CHECK(f != nullptr, "FashionMnist: cannot open '", path, "'");
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{f};
  auto read_exact = [&](void* dst, size_t n, const char* what) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f, static_cast<char*>(dst) + done, chunk);
      if (got <= 0) {
        int err = 0;
        const char* msg = gzerror(f, &err);
        DPAR_FAIL("FashionMnist: '", path, "' is truncated or corrupt while reading ", what,
                  err != Z_OK && msg ? std::string(" (") + msg + ")" : std::string());
      }
      done += static_cast<size_t>(got);
    }
  };
  auto read_u32 = [&](const char* what) {
    uint8_t b[4];
    read_exact(b, 4, what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  };
  const uint32_t magic = read_u32("the header");
  const uint32_t expected = 0x0800u | static_cast<uint32_t>(ndims);  // uint8 data, ndims dims
  DPAR_CHECK(magic == expected, "FashionMnist: '", path, "' is not an idx file with ", ndims,
             " dimension(s) of uint8 (magic ", magic, ", expected ", expected, ")");
  sizes.clear();
  size_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    sizes.push_back(read_u32("the header"));
    const bool overflow = __builtin_mul_overflow(total, static_cast<size_t>(sizes.back()), &total);
    DPAR_CHECK(!overflow && total < (size_t{1} << 33), "FashionMnist: '", path,
               "' claims more than 8 GiB of data (dimensions ", sizes, ")");
  }
  // Read in chunks, growing the buffer only as data arrives: a header claiming gigabytes in a
  // short file fails as truncated instead of allocating what it claims (found by fuzz_idx).
  constexpr size_t kChunk = size_t{16} << 20;
  std::vector<uint8_t> data;
  for (size_t done = 0; done < total;) {
    const size_t n = std::min(kChunk, total - done);
    data.resize(done + n);
    read_exact(data.data() + done, n, "the data");
    done += n;
  }
  return data;
}

// The file as named in the dataset release, plain or gzipped.
std::string find_file(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  for (const std::string& candidate : {name, name + ".gz"}) {
    const fs::path p = fs::path(dir) / candidate;
    if (fs::is_regular_file(p)) return p.string();
  }
  DPAR_FAIL("FashionMnist: neither '", name, "' nor '", name, ".gz' found in '", dir,
            "' (Debian: apt install dataset-fashion-mnist, files in ", FashionMnist::kDebianDir,
            ")");
}

}  // namespace

Compose FashionMnist::transform(std::vector<std::shared_ptr<const Transform>> steps) {
  return Compose(std::move(steps), ToTensorNormalize::grey());
}

FashionMnist::FashionMnist(const std::string& dir, Split split, Compose transform, size_t limit)
    : transform_(std::move(transform)) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  std::vector<int64_t> image_sizes, label_sizes;
  pixels_ = read_idx(images_path, 3, image_sizes);
  labels_ = read_idx(labels_path, 1, label_sizes);
  DPAR_CHECK(image_sizes[0] == label_sizes[0], "FashionMnist: '", images_path, "' has ",
             image_sizes[0], " images but '", labels_path, "' has ", label_sizes[0], " labels");
  rows_ = image_sizes[1];
  cols_ = image_sizes[2];
  DPAR_CHECK(rows_ > 0 && cols_ > 0, "FashionMnist: '", images_path, "' has empty images (", rows_,
             "x", cols_, ")");
  for (size_t i = 0; i < labels_.size(); ++i) {
    DPAR_CHECK(labels_[i] < 10, "FashionMnist: '", labels_path, "' has label ", int{labels_[i]},
               " at index ", i, ", expected 0..9");
  }
  if (limit > 0 && limit < labels_.size()) {
    labels_.resize(limit);
    pixels_.resize(limit * static_cast<size_t>(rows_ * cols_));
    pixels_.shrink_to_fit();
  }
}

std::vector<std::string> FashionMnist::class_names() const {
  return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
          "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
}

Image FashionMnist::image(size_t index) const {
  DPAR_CHECK(index < size(), "FashionMnist: index ", index, " out of range for ", size(),
             " examples");
  Image img(rows_, cols_, 1);
  const size_t n = static_cast<size_t>(rows_ * cols_);
  std::copy_n(pixels_.begin() + static_cast<std::ptrdiff_t>(index * n), n, img.pixels.begin());
  return img;
}

int64_t FashionMnist::label(size_t index) const {
  DPAR_CHECK(index < size(), "FashionMnist: index ", index, " out of range for ", size(),
             " examples");
  return labels_[index];
}

Example FashionMnist::get(size_t index, Generator& rng) const {
  return {transform_(image(index), rng), label(index)};
}

// ---- Subset ---------------------------------------------------------------------------------

Subset::Subset(std::shared_ptr<const Dataset> base, std::vector<size_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  DPAR_CHECK(base_ != nullptr, "Subset: base dataset is null");
  const size_t n = base_->size();
  for (size_t i = 0; i < indices_.size(); ++i) {
    DPAR_CHECK(indices_[i] < n, "Subset: index ", indices_[i], " (entry ", i,
               ") out of range for a dataset of ", n, " examples");
  }
}

Example Subset::get(size_t index, Generator& rng) const {
  DPAR_CHECK(index < indices_.size(), "Subset: index ", index, " out of range for ",
             indices_.size(), " examples");
  return base_->get(indices_[index], rng);
}

}  // namespace dpar::data
