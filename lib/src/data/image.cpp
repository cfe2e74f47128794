// Image decoding and writing through stb_image / stb_image_write. The stb implementations are
// compiled into this file with static linkage (STB_*_STATIC), so they cannot clash with any
// other copy of stb in the process; stb_image keeps its error string in a thread_local when
// compiled as C++11 or later, which makes concurrent decoding from loader threads safe.
#include "dpar/data/image.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "dpar/core/error.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_FAILURE_USERMSG
// Only the formats data sets hold: every other decoder is attack surface without a user.
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#if defined(__clang__)
// Debian's stb_image (2022-09-08) lets its JPEG decoder's count of buffered bits go negative on
// corrupt entropy-coded data and then shifts by more than 31 (stbi__grow_buffer_unsafe; found by
// fuzz_image: UBSan "shift exponent 34"); stb 2.28 checks the count first. Nothing dpar can
// check beforehand short of decoding. The shift only fills stb's bit buffer with garbage: the
// image fails to decode or decodes to garbage pixels, and ASan finds no memory error on that
// input (tests/fuzz/regressions/fuzz_image/jpeg-negative-bit-count.jpg, re-run by every fuzz
// run). So that one check is left out, for stb's functions only; the fuzz build is clang's.
#pragma clang attribute push(__attribute__((no_sanitize("shift-exponent"))), apply_to = function)
#endif
#include <stb_image.h>
#if defined(__clang__)
#pragma clang attribute pop
#endif
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#pragma GCC diagnostic pop

namespace dpar::data {

namespace {

// Checked before the pixel buffer is sized: h * w must neither overflow nor exceed the limit.
int64_t checked_image_bytes(int64_t h, int64_t w, int64_t c) {
  DPAR_CHECK(h >= 0 && w >= 0 && (c == 1 || c == 3), "Image: invalid size ", h, "x", w, "x", c,
             " (channels must be 1 or 3)");
  DPAR_CHECK(w == 0 || h <= kMaxImagePixels / w, "Image: ", h, "x", w,
             " pixels is more than dpar handles (", kMaxImagePixels, ")");
  return h * w * c;
}

}  // namespace

Image::Image(int64_t h, int64_t w, int64_t c)
    : height(h), width(w), channels(c), pixels(static_cast<size_t>(checked_image_bytes(h, w, c))) {}

namespace {

// Debian's stb_image (2022-09-08) trusts the code counts of a JPEG Huffman table (DHT): more
// than 256 codes overrun its fixed tables (found by fuzz_image; UBSan: index 257 out of bounds
// in stbi__build_huffman). Walks the marker segments as stb does, including segments between
// progressive scans, and returns what is wrong with the first bad table, or "".
std::string bad_jpeg_huffman_table(const uint8_t* d, size_t n) {
  // stb takes anything starting with 0xFF, fill bytes and all, to its JPEG reader (fuzz_image
  // found FF FF FF D8 passing a check that wanted FF D8 at byte 0).
  if (n < 2 || d[0] != 0xFF) return "";
  size_t i = 0;
  while (i + 1 < n) {
    if (d[i] != 0xFF) {  // entropy-coded data between scans (or junk stb rejects itself)
      ++i;
      continue;
    }
    const uint8_t m = d[i + 1];
    // Fill bytes, stuffed zeros, restart markers, TEM and SOI carry no length.
    if (m == 0xFF) {
      ++i;
      continue;
    }
    if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) {
      i += 2;
      continue;
    }
    if (m == 0xD9 || i + 4 > n) break;  // EOI, or a truncated length
    const size_t end = i + 2 + (size_t{d[i + 2]} << 8 | d[i + 3]);
    if (m == 0xC4) {
      // As stb: a table starts wherever the segment has bytes left, and is read whole even past
      // the segment's end (bytes past the file read as 0).
      for (size_t t = i + 4; t < end && t < n;) {
        size_t codes = 0;
        for (size_t k = 1; k <= 16; ++k) codes += t + k < n ? d[t + k] : 0;
        if (codes > 256) {
          return "a Huffman table with " + std::to_string(codes) + " codes (at most 256) at byte " +
                 std::to_string(t);
        }
        t += 17 + codes;
      }
    }
    i = end;
  }
  return "";
}

bool is_png(const uint8_t* d, size_t n) {
  static constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return n >= 8 && std::equal(kSignature, kSignature + 8, d);
}

// The data length a PNG chunk at byte `at` declares (big-endian, before its type).
size_t png_chunk_length(const uint8_t* d, size_t at) {
  return size_t{d[at]} << 24 | size_t{d[at + 1]} << 16 | size_t{d[at + 2]} << 8 | d[at + 3];
}

// Where the PNG chunk at byte `at` ends: length, type, data, CRC (at most the file's end).
size_t png_chunk_end(const uint8_t* d, size_t n, size_t at) {
  return std::min(n, at + 12 + png_chunk_length(d, at));
}

// stb_image sizes its buffer for a PNG's compressed data from the chunk lengths the file
// declares, before reading them: a 99-byte file whose second IDAT claimed 1.6 GB made it
// realloc 2 GiB (fuzz_image, out of memory). Walks the chunks as stb does and returns what is
// wrong with the first one that claims more bytes than the file has left, or "". Once every
// length fits, stb's buffer stays under twice the file's size.
std::string bad_png_chunk(const uint8_t* d, size_t n) {
  if (!is_png(d, n)) return "";
  for (size_t at = 8; at + 8 <= n; at = png_chunk_end(d, n, at)) {
    const size_t length = png_chunk_length(d, at);
    const size_t left = n - at - 8;
    if (length > left) {
      return "the chunk at byte " + std::to_string(at) + " claims " + std::to_string(length) +
             " bytes, but the file has " + std::to_string(left) + " left";
    }
    if (std::equal(d + at + 4, d + at + 8, "IEND")) break;
  }
  return "";
}

// stb_image allocates its buffer for a PNG's image data at the first non-empty IDAT chunk and
// copies every IDAT into it, so an empty IDAT before that one has it memcpy 0 bytes to a null
// pointer (fuzz_image, UBSan: undefined behaviour, though nothing is written). An empty IDAT
// carries nothing, and the format allows it: stb gets a copy without the empty ones (only when
// there are some; the chunk lengths were checked by bad_png_chunk). Returns the copy, or an
// empty vector when the file has none.
std::vector<uint8_t> png_without_empty_idat(const uint8_t* d, size_t n) {
  if (!is_png(d, n)) return {};
  auto empty_idat = [&](size_t at) {
    return png_chunk_length(d, at) == 0 && std::equal(d + at + 4, d + at + 8, "IDAT");
  };
  bool any = false;
  for (size_t at = 8; at + 8 <= n && !any; at = png_chunk_end(d, n, at)) any = empty_idat(at);
  if (!any) return {};
  std::vector<uint8_t> out(d, d + 8);
  size_t at = 8;
  for (; at + 8 <= n; at = png_chunk_end(d, n, at)) {
    if (!empty_idat(at)) out.insert(out.end(), d + at, d + png_chunk_end(d, n, at));
  }
  out.insert(out.end(), d + at, d + n);  // a trailing fragment stays, for stb to judge
  return out;
}

}  // namespace

Image decode_image(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels) {
  DPAR_CHECK(max_pixels > 0 && max_pixels <= kMaxImagePixels, "cannot decode image '", name,
             "': max_pixels must be in 1..", kMaxImagePixels, ", got ", max_pixels);
  DPAR_CHECK(size > 0, "cannot decode image '", name, "': the file is empty");
  DPAR_CHECK(size <= static_cast<size_t>(INT32_MAX), "cannot decode image '", name,
             "': file too large (", size, " bytes)");
  int len = static_cast<int>(size);
  // Before stb sees the bytes at all: stbi_info already builds the tables.
  if (const std::string bad = bad_jpeg_huffman_table(data, size); !bad.empty()) {
    DPAR_FAIL("cannot decode image '", name, "': corrupt JPEG: ", bad);
  }
  if (const std::string bad = bad_png_chunk(data, size); !bad.empty()) {
    DPAR_FAIL("cannot decode image '", name, "': corrupt PNG: ", bad);
  }
  const std::vector<uint8_t> png_copy = png_without_empty_idat(data, size);
  if (!png_copy.empty()) {
    data = png_copy.data();
    len = static_cast<int>(png_copy.size());
  }
  int w = 0, h = 0, comp = 0;
  if (!stbi_info_from_memory(data, len, &w, &h, &comp)) {
    DPAR_FAIL("cannot decode image '", name, "': ", stbi_failure_reason());
  }
  // Refused before decoding: a 30-byte PNG header can claim gigabytes. A BMP's height is
  // negative for top-down rows (stb decodes its magnitude), so the magnitudes are checked.
  const int64_t claimed = std::abs(int64_t{w}) * std::abs(int64_t{h});
  DPAR_CHECK(claimed <= max_pixels, "cannot decode image '", name, "': ", std::abs(int64_t{w}), "x",
             std::abs(int64_t{h}), " pixels is more than dpar decodes (", max_pixels, ")");
  // Grey stays grey (a third of the memory); ToTensorNormalize replicates it to 3 channels.
  const int want = comp <= 2 ? 1 : 3;
  stbi_uc* pixels = stbi_load_from_memory(data, len, &w, &h, &comp, want);
  if (!pixels) DPAR_FAIL("cannot decode image '", name, "': ", stbi_failure_reason());
  Image img;
  img.height = h;
  img.width = w;
  img.channels = want;
  img.pixels.assign(pixels, pixels + static_cast<size_t>(w) * h * want);
  stbi_image_free(pixels);
  return img;
}

Image read_image(const std::string& path, int64_t max_pixels) {
  std::ifstream in(path, std::ios::binary);
  DPAR_CHECK(in.good(), "cannot read image '", path, "': cannot open the file");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  DPAR_CHECK(!in.bad(), "cannot read image '", path, "': read error");
  return decode_image(bytes.data(), bytes.size(), path, max_pixels);
}

namespace {

void check_writable(const Image& image, const std::string& path, const char* what) {
  DPAR_CHECK(image.channels == 1 || image.channels == 3, what, ": '", path, "': image has ",
             image.channels, " channels, expected 1 or 3");
  DPAR_CHECK(image.height > 0 && image.width > 0 && image.height < INT32_MAX / 4 &&
                 image.width < INT32_MAX / 4,
             what, ": '", path, "': invalid image size ", image.height, "x", image.width);
  DPAR_CHECK(
      image.pixels.size() == static_cast<size_t>(image.height * image.width * image.channels), what,
      ": '", path, "': pixel buffer has ", image.pixels.size(), " bytes, expected ",
      image.height * image.width * image.channels);
}

}  // namespace

void write_jpeg(const std::string& path, const Image& image, int quality) {
  check_writable(image, path, "write_jpeg");
  DPAR_CHECK(quality >= 1 && quality <= 100, "write_jpeg: quality must be in 1..100, got ",
             quality);
  const int ok =
      stbi_write_jpg(path.c_str(), static_cast<int>(image.width), static_cast<int>(image.height),
                     static_cast<int>(image.channels), image.pixels.data(), quality);
  DPAR_CHECK(ok, "write_jpeg: cannot write '", path, "'");
}

void write_png(const std::string& path, const Image& image) {
  check_writable(image, path, "write_png");
  const int ok =
      stbi_write_png(path.c_str(), static_cast<int>(image.width), static_cast<int>(image.height),
                     static_cast<int>(image.channels), image.pixels.data(),
                     static_cast<int>(image.width * image.channels));
  DPAR_CHECK(ok, "write_png: cannot write '", path, "'");
}

}  // namespace dpar::data
