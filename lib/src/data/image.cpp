// Image decoding and writing through stb_image / stb_image_write. The stb implementations are
// compiled into this file with static linkage (STB_*_STATIC), so they cannot clash with any
// other copy of stb in the process; stb_image keeps its error string in a thread_local when
// compiled as C++11 or later, which makes concurrent decoding from loader threads safe.
#include "dpar/data/image.h"

#include <climits>
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
#include <stb_image.h>
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#pragma GCC diagnostic pop

namespace dpar::data {

Image::Image(int64_t h, int64_t w, int64_t c)
    : height(h), width(w), channels(c), pixels(static_cast<size_t>(h * w * c), 0) {
  DPAR_CHECK(h >= 0 && w >= 0 && (c == 1 || c == 3), "Image: invalid size ", h, "x", w, "x", c,
             " (channels must be 1 or 3)");
}

Image decode_image(const uint8_t* data, size_t size, const std::string& name) {
  DPAR_CHECK(size > 0, "cannot decode image '", name, "': the file is empty");
  DPAR_CHECK(size <= static_cast<size_t>(INT32_MAX), "cannot decode image '", name,
             "': file too large (", size, " bytes)");
  const int len = static_cast<int>(size);
  int w = 0, h = 0, comp = 0;
  if (!stbi_info_from_memory(data, len, &w, &h, &comp)) {
    DPAR_FAIL("cannot decode image '", name, "': ", stbi_failure_reason());
  }
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

Image read_image(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPAR_CHECK(in.good(), "cannot read image '", path, "': cannot open the file");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  DPAR_CHECK(!in.bad(), "cannot read image '", path, "': read error");
  return decode_image(bytes.data(), bytes.size(), path);
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
