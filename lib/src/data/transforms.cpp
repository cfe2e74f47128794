// Image transforms. Resampling is separable: a vertical pass into a float row, then a
// horizontal pass with rounding back to uint8. The filter is PIL's bilinear (a triangle whose
// support grows with the shrink factor, so downscaling averages instead of aliasing), which
// is what torchvision's PIL-based transforms use.
#include "dpar/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dpar::data {
namespace {

// Filter taps for resampling a window of in_size pixels to out_size pixels.
struct Taps {
  std::vector<int64_t> first;  // first input pixel (relative to the window) of each output
  std::vector<int64_t> count;  // number of taps of each output
  std::vector<float> weights;  // out_size x max_taps, normalised to sum 1
  int64_t max_taps = 0;
};

Taps compute_taps(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle has radius 1 before scaling
  Taps taps;
  taps.max_taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size * taps.max_taps), 0.f);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int64_t lo =
        std::max<int64_t>(static_cast<int64_t>(std::floor(center - support + 0.5)), 0);
    const int64_t hi =
        std::min<int64_t>(static_cast<int64_t>(std::floor(center + support + 0.5)), in_size);
    float* w = &taps.weights[static_cast<size_t>(o * taps.max_taps)];
    double total = 0;
    std::vector<double> raw;
    for (int64_t x = lo; x < hi; ++x) {
      const double d = std::abs((static_cast<double>(x) - center + 0.5) / filter_scale);
      raw.push_back(d < 1.0 ? 1.0 - d : 0.0);
      total += raw.back();
    }
    const int64_t n = static_cast<int64_t>(raw.size());
    taps.first[o] = lo;
    taps.count[o] = std::min(n, taps.max_taps);
    for (int64_t k = 0; k < taps.count[o]; ++k) {
      w[k] = total > 0 ? static_cast<float>(raw[static_cast<size_t>(k)] / total) : 0.f;
    }
  }
  return taps;
}

uint8_t to_u8(float v) {
  return static_cast<uint8_t>(std::clamp(std::floor(v + 0.5f), 0.0f, 255.0f));
}

// Python's round() (half to even), which torchvision uses for crop offsets and sizes.
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

int64_t randint(Generator& rng, int64_t n) {  // uniform in [0, n)
  return static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n));
}

double uniform(Generator& rng, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(rng.uniform());
}

void check_image(const Image& image, const char* op) {
  DPAR_CHECK(image.channels == 1 || image.channels == 3, op,
             ": expected a 1- or 3-channel image, got ", image.channels, " channels");
  DPAR_CHECK(image.height > 0 && image.width > 0, op, ": empty image (", image.height, "x",
             image.width, ")");
  DPAR_CHECK(
      image.pixels.size() == static_cast<size_t>(image.height * image.width * image.channels), op,
      ": pixel buffer has ", image.pixels.size(), " bytes for a ", image.height, "x", image.width,
      "x", image.channels, " image");
}

// Vertical pass first, one output row at a time: it reads whole source rows contiguously
// (vectorises), leaving a single float row for the horizontal pass.
template <int C>
void resample(const Image& image, int64_t x0, int64_t y0, int64_t w, const Taps& tx, const Taps& ty,
              Image& out) {
  const int64_t row_len = w * C;
  std::vector<float> acc(static_cast<size_t>(row_len));
  for (int64_t o = 0; o < out.height; ++o) {
    std::fill(acc.begin(), acc.end(), 0.f);
    const float* wy = &ty.weights[static_cast<size_t>(o * ty.max_taps)];
    for (int64_t k = 0; k < ty.count[o]; ++k) {
      const uint8_t* src = image.row(y0 + ty.first[o] + k) + x0 * C;
      const float wk = wy[k];
      float* a = acc.data();
      for (int64_t i = 0; i < row_len; ++i) a[i] += wk * static_cast<float>(src[i]);
    }
    uint8_t* dst = out.row(o);
    for (int64_t x = 0; x < out.width; ++x) {
      const float* wx = &tx.weights[static_cast<size_t>(x * tx.max_taps)];
      const float* a = acc.data() + tx.first[x] * C;
      float sum[C] = {};
      for (int64_t k = 0; k < tx.count[x]; ++k) {
        for (int ch = 0; ch < C; ++ch) sum[ch] += wx[k] * a[k * C + ch];
      }
      for (int ch = 0; ch < C; ++ch) dst[x * C + ch] = to_u8(sum[ch]);
    }
  }
}

}  // namespace

Image resize_window(const Image& image, int64_t x0, int64_t y0, int64_t w, int64_t h, int64_t out_h,
                    int64_t out_w) {
  check_image(image, "resize");
  DPAR_CHECK(
      x0 >= 0 && y0 >= 0 && w > 0 && h > 0 && x0 + w <= image.width && y0 + h <= image.height,
      "resize: window x=", x0, " y=", y0, " w=", w, " h=", h, " is outside the ", image.height, "x",
      image.width, " image");
  DPAR_CHECK(out_h > 0 && out_w > 0, "resize: output size must be positive, got ", out_h, "x",
             out_w);
  const int64_t c = image.channels;
  Image out(out_h, out_w, c);
  if (w == out_w && h == out_h) {  // a plain crop
    for (int64_t y = 0; y < h; ++y) {
      std::memcpy(out.row(y), image.row(y0 + y) + x0 * c, static_cast<size_t>(w * c));
    }
    return out;
  }
  const Taps tx = compute_taps(w, out_w);
  const Taps ty = compute_taps(h, out_h);
  if (c == 1) {
    resample<1>(image, x0, y0, w, tx, ty, out);
  } else {
    resample<3>(image, x0, y0, w, tx, ty, out);
  }
  return out;
}

// ---- Resize -----------------------------------------------------------------------------------

Resize::Resize(int64_t size) : size_(size) {
  DPAR_CHECK(size > 0, "Resize: size must be positive, got ", size);
}

Resize::Resize(int64_t height, int64_t width) : height_(height), width_(width) {
  DPAR_CHECK(height > 0 && width > 0, "Resize: size must be positive, got ", height, "x", width);
}

Image Resize::operator()(Image image, Generator&) const {
  check_image(image, "Resize");
  int64_t oh = height_, ow = width_;
  if (size_ > 0) {
    const int64_t h = image.height, w = image.width;
    // Checked before the exact sizes are computed (size_ * side must not overflow either): a
    // thin image resized by its short side grows without bound along its long side.
    const double long_out = static_cast<double>(size_) * static_cast<double>(std::max(h, w)) /
                            static_cast<double>(std::min(h, w));
    DPAR_CHECK(long_out * static_cast<double>(size_) <= static_cast<double>(kMaxImagePixels),
               "Resize: a ", h, "x", w, " image resized to a short side of ", size_, " would be ",
               static_cast<int64_t>(long_out), "x", size_, " pixels, more than dpar handles (",
               kMaxImagePixels, ")");
    if (w <= h) {
      ow = size_;
      oh = size_ * h / w;
    } else {
      oh = size_;
      ow = size_ * w / h;
    }
  }
  if (oh == image.height && ow == image.width) return image;
  return resize_window(image, 0, 0, image.width, image.height, oh, ow);
}

// ---- RandomResizedCrop -----------------------------------------------------------------------

RandomResizedCrop::RandomResizedCrop(int64_t size, std::pair<double, double> scale,
                                     std::pair<double, double> ratio)
    : size_(size), scale_(scale), ratio_(ratio) {
  DPAR_CHECK(size > 0, "RandomResizedCrop: size must be positive, got ", size);
  DPAR_CHECK(scale.first > 0 && scale.first <= scale.second && scale.second <= 1,
             "RandomResizedCrop: scale must satisfy 0 < min <= max <= 1, got (", scale.first, ", ",
             scale.second, ")");
  DPAR_CHECK(ratio.first > 0 && ratio.first <= ratio.second,
             "RandomResizedCrop: ratio must satisfy 0 < min <= max, got (", ratio.first, ", ",
             ratio.second, ")");
}

Image RandomResizedCrop::operator()(Image image, Generator& rng) const {
  check_image(image, "RandomResizedCrop");
  const int64_t height = image.height, width = image.width;
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(ratio_.first), log_hi = std::log(ratio_.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(rng, scale_.first, scale_.second);
    const double aspect = std::exp(uniform(rng, log_lo, log_hi));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = randint(rng, height - h + 1);
      const int64_t left = randint(rng, width - w + 1);
      return resize_window(image, left, top, w, h, size_, size_);
    }
  }
  // Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio_.first) {
    h = std::clamp<int64_t>(round_half_even(static_cast<double>(w) / ratio_.first), 1, height);
  } else if (in_ratio > ratio_.second) {
    w = std::clamp<int64_t>(round_half_even(static_cast<double>(h) * ratio_.second), 1, width);
  }
  return resize_window(image, (width - w) / 2, (height - h) / 2, w, h, size_, size_);
}

// ---- RandomHorizontalFlip --------------------------------------------------------------------

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  DPAR_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Image RandomHorizontalFlip::operator()(Image image, Generator& rng) const {
  check_image(image, "RandomHorizontalFlip");
  // Always draw, so the generator advances the same way whatever the outcome.
  if (!(static_cast<double>(rng.uniform()) < p_)) return image;
  const int64_t c = image.channels;
  for (int64_t y = 0; y < image.height; ++y) {
    uint8_t* row = image.row(y);
    for (int64_t l = 0, r = image.width - 1; l < r; ++l, --r) {
      for (int64_t ch = 0; ch < c; ++ch) std::swap(row[l * c + ch], row[r * c + ch]);
    }
  }
  return image;
}

// ---- CenterCrop -----------------------------------------------------------------------------

CenterCrop::CenterCrop(int64_t size) : size_(size) {
  DPAR_CHECK(size > 0, "CenterCrop: size must be positive, got ", size);
}

Image Grayscale::operator()(Image image, Generator&) const {
  if (image.channels == 1) return image;
  check_image(image, "Grayscale");
  Image grey(image.height, image.width, 1);
  const int64_t n = image.height * image.width;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = image.pixels.data() + i * image.channels;
    const float l = 0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2];
    grey.pixels[static_cast<size_t>(i)] = static_cast<uint8_t>(std::min(255.f, l + 0.5f));
  }
  return grey;
}

Image CenterCrop::operator()(Image image, Generator&) const {
  check_image(image, "CenterCrop");
  if (image.height < size_ || image.width < size_) {
    // Zero padding as torchvision: left/top get the smaller half.
    const int64_t ph = std::max<int64_t>(size_ - image.height, 0);
    const int64_t pw = std::max<int64_t>(size_ - image.width, 0);
    Image padded(image.height + ph, image.width + pw, image.channels);
    const int64_t c = image.channels;
    for (int64_t y = 0; y < image.height; ++y) {
      std::memcpy(padded.row(y + ph / 2) + (pw / 2) * c, image.row(y),
                  static_cast<size_t>(image.width * c));
    }
    image = std::move(padded);
  }
  if (image.height == size_ && image.width == size_) return image;
  const int64_t top = round_half_even(static_cast<double>(image.height - size_) / 2.0);
  const int64_t left = round_half_even(static_cast<double>(image.width - size_) / 2.0);
  return resize_window(image, left, top, size_, size_, size_, size_);
}

// ---- ToTensorNormalize ----------------------------------------------------------------------

ToTensorNormalize::ToTensorNormalize(std::array<float, 3> mean, std::array<float, 3> std)
    : mean_(mean) {
  for (int c = 0; c < 3; ++c) {
    DPAR_CHECK(std[c] > 0, "ToTensorNormalize: std must be positive, got ", std[c], " for channel ",
               c);
    inv_std_[c] = 1.0f / std[c];
  }
}

ToTensorNormalize ToTensorNormalize::grey(float mean, float std) {
  ToTensorNormalize t({mean, mean, mean}, {std, std, std});
  t.channels_ = 1;
  return t;
}

Tensor ToTensorNormalize::operator()(const Image& image) const {
  check_image(image, "ToTensorNormalize");
  const int64_t h = image.height, w = image.width, c = image.channels;
  DPAR_CHECK(channels_ == 3 || c == 1, "ToTensorNormalize::grey: expects grey images, got ", c,
             " channels (", h, "x", w, ")");
  Tensor out = Tensor::empty({channels_, h, w});
  float* dst = out.data<float>();
  const int64_t plane = h * w;
  for (int64_t ch = 0; ch < channels_; ++ch) {
    // Per-channel lookup table: 256 values instead of a divide per pixel.
    float lut[256];
    for (int v = 0; v < 256; ++v) {
      lut[v] = (static_cast<float>(v) / 255.0f - mean_[ch]) * inv_std_[ch];
    }
    const int64_t src_ch = c == 1 ? 0 : ch;
    const uint8_t* src = image.pixels.data() + src_ch;
    float* d = dst + ch * plane;
    for (int64_t i = 0; i < plane; ++i) d[i] = lut[src[i * c]];
  }
  return out;
}

// ---- Compose --------------------------------------------------------------------------------

Compose::Compose(std::vector<std::shared_ptr<const Transform>> steps, ToTensorNormalize to_tensor)
    : steps_(std::move(steps)), to_tensor_(to_tensor) {
  for (size_t i = 0; i < steps_.size(); ++i) {
    DPAR_CHECK(steps_[i] != nullptr, "Compose: transform ", i, " is null");
  }
}

Image Compose::apply_image(Image image, Generator& rng) const {
  for (const auto& step : steps_) image = (*step)(std::move(image), rng);
  return image;
}

Tensor Compose::operator()(Image image, Generator& rng) const {
  return to_tensor_(apply_image(std::move(image), rng));
}

Compose imagenet_train_transform(int64_t size) {
  return Compose(
      {std::make_shared<RandomResizedCrop>(size), std::make_shared<RandomHorizontalFlip>(0.5)});
}

Compose imagenet_eval_transform(int64_t size, int64_t resize) {
  return Compose({std::make_shared<Resize>(resize), std::make_shared<CenterCrop>(size)});
}

}  // namespace dpar::data
