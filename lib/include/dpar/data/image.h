#pragma once
// 8-bit images in memory (height x width x channels, row-major, channels interleaved), and
// decoding (JPEG, PNG, BMP via stb_image) and writing (JPEG, PNG) them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dpar::data {

// The most pixels an image may have, decoded or made by a transform (8192 x 8192): no training
// image is that large, and a few header bytes can otherwise claim gigabytes (a 70-byte BMP of
// 1 x 16M pixels, resized to a short side of 18, asked for 16 GB).
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;         // 1 (grey) or 3 (RGB)
  std::vector<uint8_t> pixels;  // height * width * channels bytes, HWC

  Image() = default;
  // Zero-filled; throws dpar::Error for a negative size or more than kMaxImagePixels pixels.
  Image(int64_t height, int64_t width, int64_t channels);
  bool empty() const { return pixels.empty(); }
  uint8_t* row(int64_t y) { return pixels.data() + y * width * channels; }
  const uint8_t* row(int64_t y) const { return pixels.data() + y * width * channels; }
};

// Decodes an image file. Grey (and grey+alpha) images come back with 1 channel, everything
// else as RGB (alpha dropped). Throws dpar::Error naming the file when it cannot be read or
// decoded, or when its header claims more than max_pixels pixels (checked before decoding, as
// PIL's MAX_IMAGE_PIXELS; at most kMaxImagePixels). Thread-safe.
Image read_image(const std::string& path, int64_t max_pixels = kMaxImagePixels);
// Same for bytes in memory; name is used in error messages.
Image decode_image(const uint8_t* data, size_t size, const std::string& name,
                   int64_t max_pixels = kMaxImagePixels);

// Write 1- or 3-channel images; quality is 1..100. Throw dpar::Error naming the file.
void write_jpeg(const std::string& path, const Image& image, int quality = 95);
void write_png(const std::string& path, const Image& image);

}  // namespace dpar::data
