// Data pipeline: Fashion-MNIST reading, image decode/encode, ImageFolder (on a tiny folder
// written here), transforms, samplers and the multi-threaded DataLoader (determinism across
// worker counts, error propagation, shutdown mid-epoch).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "dpar/data/dataloader.h"
#include "dpar/data/dataset.h"
#include "dpar/data/image.h"
#include "dpar/data/sampler.h"
#include "dpar/data/transforms.h"
#include "dpar/dpar.h"

using namespace dpar;
using namespace dpar::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("dpar_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// An image whose pixels encode their position (so crops and flips can be checked exactly).
Image gradient_image(int64_t h, int64_t w, int64_t c) {
  Image img(h, w, c);
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      for (int64_t ch = 0; ch < c; ++ch) {
        img.row(y)[x * c + ch] = static_cast<uint8_t>((y * 7 + x * 3 + ch * 50) % 256);
      }
    }
  }
  return img;
}

Image constant_image(int64_t h, int64_t w, int64_t c, uint8_t v) {
  Image img(h, w, c);
  std::fill(img.pixels.begin(), img.pixels.end(), v);
  return img;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

std::shared_ptr<const FashionMnist> fashion_subset(size_t limit, Compose transform) {
  return std::make_shared<FashionMnist>(FashionMnist::kDebianDir, Split::Train,
                                        std::move(transform), limit);
}

}  // namespace

// ---- Fashion-MNIST -----------------------------------------------------------------------------

TEST_CASE("Fashion-MNIST splits, labels and pixels", "[data]") {
  FashionMnist train(FashionMnist::kDebianDir, Split::Train);
  FashionMnist test(FashionMnist::kDebianDir, Split::Test);
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.class_names().size() == 10);
  CHECK(train.class_names()[9] == "Ankle boot");
  const std::vector<int64_t> first_train{9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  const std::vector<int64_t> first_test{9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  for (size_t i = 0; i < 10; ++i) {
    CHECK(train.label(i) == first_train[i]);
    CHECK(test.label(i) == first_test[i]);
  }
  // Raw pixels of the first training image (values from the numpy reading of the file).
  const Image img = train.image(0);
  CHECK(img.height == 28);
  CHECK(img.width == 28);
  CHECK(img.channels == 1);
  const auto [lo, hi] = std::minmax_element(img.pixels.begin(), img.pixels.end());
  CHECK(*lo == 0);
  CHECK(*hi == 255);
  int64_t sum = 0;
  for (uint8_t v : img.pixels) sum += v;
  CHECK(sum == 76247);
  CHECK(int{img.row(10)[13]} == 193);
  CHECK(int{img.row(10)[14]} == 228);

  // The default transform: grey replicated to 3 channels, ImageNet normalisation.
  Generator rng(0);
  Example ex = train.get(0, rng);
  CHECK(ex.label == 9);
  REQUIRE(ex.image.shape() == Shape{3, 28, 28});
  const std::vector<float> v = ex.image.to_float_vector();
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  for (int c = 0; c < 3; ++c) {
    const auto begin = v.begin() + c * 784;
    CHECK(*std::min_element(begin, begin + 784) == Approx((0.f - mean[c]) / stdv[c]));
    CHECK(*std::max_element(begin, begin + 784) == Approx((1.f - mean[c]) / stdv[c]));
    CHECK(v[static_cast<size_t>(c * 784 + 10 * 28 + 13)] ==
          Approx((193.f / 255.f - mean[c]) / stdv[c]));
  }

  // One channel with Fashion-MNIST's own statistics, for a model of one's own.
  FashionMnist grey(FashionMnist::kDebianDir, Split::Train, FashionMnist::transform(), 1);
  Example g = grey.get(0, rng);
  REQUIRE(g.image.shape() == Shape{1, 28, 28});
  CHECK(g.image.to_float_vector()[10 * 28 + 13] == Approx((193.f / 255.f - 0.2860f) / 0.3530f));
  Image colour(2, 2, 3);
  CHECK_THROWS_WITH(ToTensorNormalize::grey()(colour), Contains("expects grey images, got 3"));
  // Grayscale: torchvision's luma weights, rounded.
  colour.pixels = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
  const Image g1 = Grayscale()(colour, rng);
  CHECK(g1.channels == 1);
  CHECK(g1.pixels == std::vector<uint8_t>{76, 150, 29, 18});

  FashionMnist small(FashionMnist::kDebianDir, Split::Test, Compose(), 100);
  CHECK(small.size() == 100);
  CHECK(small.label(1) == 2);
  CHECK_THROWS_WITH(small.get(100, rng), Contains("index 100 out of range"));
}

TEST_CASE("Fashion-MNIST idx files: plain files and errors", "[data]") {
  TempDir tmp;
  // Two 2x3 images and their labels, uncompressed.
  std::string images{0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3};
  for (int i = 0; i < 12; ++i) images.push_back(static_cast<char>(i * 20));
  write_file(tmp.path() / "train-images-idx3-ubyte", images);
  write_file(tmp.path() / "train-labels-idx1-ubyte", std::string{0, 0, 8, 1, 0, 0, 0, 2, 4, 7});
  FashionMnist ds(tmp.path().string(), Split::Train);
  REQUIRE(ds.size() == 2);
  CHECK(ds.label(1) == 7);
  CHECK(ds.image(1).pixels == std::vector<uint8_t>{120, 140, 160, 180, 200, 220});

  // Truncated data, a wrong magic number, and a missing split all name the file.
  write_file(tmp.path() / "train-images-idx3-ubyte", images.substr(0, images.size() - 3));
  CHECK_THROWS_WITH(FashionMnist(tmp.path().string(), Split::Train),
                    Contains("train-images-idx3-ubyte' is truncated"));
  write_file(tmp.path() / "train-images-idx3-ubyte", std::string{0, 0, 8, 1, 0, 0, 0, 0});
  CHECK_THROWS_WITH(FashionMnist(tmp.path().string(), Split::Train),
                    Contains("is not an idx file"));
  CHECK_THROWS_WITH(FashionMnist(tmp.path().string(), Split::Test),
                    Contains("t10k-images-idx3-ubyte"));
  // A 16-byte header claiming 1 x 65535 x 65535 bytes is truncated, not a 4 GiB allocation
  // (fuzz_idx); dimensions whose product overflows are refused outright.
  write_file(tmp.path() / "train-images-idx3-ubyte",
             std::string{0, 0, 8, 3, 0, 0, 0, 1, 0, 0, '\xff', '\xff', 0, 0, '\xff', '\xff', 9});
  CHECK_THROWS_WITH(FashionMnist(tmp.path().string(), Split::Train), Contains("is truncated"));
  write_file(tmp.path() / "train-images-idx3-ubyte",
             std::string{0, 0, 8, 3, '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff',
                         '\xff', '\xff', '\xff', '\xff'});
  CHECK_THROWS_WITH(FashionMnist(tmp.path().string(), Split::Train),
                    Contains("claims more than 8 GiB"));
}

// ---- images and ImageFolder ------------------------------------------------------------------

TEST_CASE("image write and read round trip", "[data]") {
  TempDir tmp;
  const Image rgb = gradient_image(9, 13, 3);
  write_png((tmp.path() / "a.png").string(), rgb);
  const Image back = read_image((tmp.path() / "a.png").string());
  CHECK(back.height == 9);
  CHECK(back.width == 13);
  CHECK(back.channels == 3);
  CHECK(back.pixels == rgb.pixels);

  // Empty IDAT chunks are legal and carry nothing; one before the image data made stb memcpy
  // to a null pointer (fuzz_image, UBSan). The same pixels come back.
  std::ifstream png_in(tmp.path() / "a.png", std::ios::binary);
  std::string png((std::istreambuf_iterator<char>(png_in)), std::istreambuf_iterator<char>());
  const size_t after_ihdr = 8 + 4 + 4 + 13 + 4;
  png.insert(after_ihdr, std::string("\0\0\0\0IDAT\x35\xaf\x06\x1e", 12));
  write_file(tmp.path() / "empty_idat.png", png);
  CHECK(read_image((tmp.path() / "empty_idat.png").string()).pixels == rgb.pixels);
  // The fuzzer's input (otherwise corrupt): an error or an image, and no undefined behaviour.
  try {
    (void)read_image(std::string(DPAR_SOURCE_DIR) +
                     "/tests/fuzz/regressions/fuzz_image/png-empty-idat-first.png");
  } catch (const Error&) {
  }

  const Image grey = gradient_image(8, 8, 1);
  write_png((tmp.path() / "g.png").string(), grey);
  CHECK(read_image((tmp.path() / "g.png").string()).channels == 1);

  write_jpeg((tmp.path() / "c.jpg").string(), constant_image(16, 16, 3, 77), 95);
  const Image jpg = read_image((tmp.path() / "c.jpg").string());
  REQUIRE(jpg.pixels.size() == 16 * 16 * 3);
  for (uint8_t v : jpg.pixels) CHECK(std::abs(int{v} - 77) <= 2);

  // A JPEG whose Huffman table declares 257 codes overran stb_image's tables (fuzz_image);
  // a PNG header claiming 16000 x 16000 pixels (768 MB, under stb's own 1 GiB cap) is refused
  // before any allocation.
  const std::string regressions = std::string(DPAR_SOURCE_DIR) + "/tests/fuzz/regressions/";
  for (const char* name : {"jpeg-dht-257-codes.jpg", "jpeg-fill-bytes-before-soi.jpg"}) {
    CHECK_THROWS_WITH(
        read_image(regressions + "fuzz_image/" + name),
        Contains("corrupt JPEG: a Huffman table with") && Contains("codes (at most 256)"));
  }
  // A PNG whose IDAT chunk claims 1.6 GB in a 99-byte file made stb allocate 2 GiB (fuzz_image).
  CHECK_THROWS_WITH(read_image(regressions + "fuzz_image/png-chunk-longer-than-file.png"),
                    Contains("corrupt PNG: the chunk at byte 86 claims 1664024617 bytes, but the "
                             "file has 13 left"));
  std::string huge_png = "\x89PNG\r\n\x1a\n";
  huge_png += std::string("\0\0\0\x0dIHDR", 8);
  huge_png += std::string("\0\0\x3e\x80\0\0\x3e\x80\x08\x02\0\0\0", 13);
  huge_png += std::string("\0\0\0\0", 4);  // CRC (stb does not check it)
  write_file(tmp.path() / "huge.png", huge_png);
  CHECK_THROWS_WITH(read_image((tmp.path() / "huge.png").string()),
                    Contains("16000x16000 pixels is more than dpar decodes"));

  write_file(tmp.path() / "bad.jpg", "this is not a jpeg");
  CHECK_THROWS_WITH(read_image((tmp.path() / "bad.jpg").string()), Contains("bad.jpg"));
  CHECK_THROWS_WITH(read_image((tmp.path() / "missing.png").string()),
                    Contains("missing.png': cannot open"));
}

TEST_CASE("ImageFolder on a tiny folder", "[data]") {
  TempDir tmp;
  const fs::path train = tmp.path() / "train";
  fs::create_directories(train / "dog");
  fs::create_directories(train / "cat");
  write_png((train / "cat" / "b.png").string(), gradient_image(20, 30, 3));
  write_jpeg((train / "cat" / "a.JPG").string(), gradient_image(40, 24, 3));
  write_png((train / "dog" / "x.png").string(), gradient_image(16, 16, 1));
  write_file(train / "dog" / "notes.txt", "not an image");

  ImageFolder ds(train.string(), imagenet_eval_transform(12, 14));
  REQUIRE(ds.size() == 3);
  CHECK(ds.class_names() == std::vector<std::string>{"cat", "dog"});
  CHECK(fs::path(ds.path(0)).filename() == "a.JPG");
  CHECK(fs::path(ds.path(1)).filename() == "b.png");
  CHECK(ds.label(1) == 0);
  CHECK(ds.label(2) == 1);
  Generator rng(1);
  for (size_t i = 0; i < ds.size(); ++i) {
    Example ex = ds.get(i, rng);
    CHECK(ex.image.shape() == Shape{3, 12, 12});
    CHECK(ex.label == ds.label(i));
  }

  // A corrupt image fails when read, naming the file.
  write_file(train / "dog" / "y.jpg", std::string(100, '\x11'));
  ImageFolder with_bad(train.string());
  CHECK_THROWS_WITH(with_bad.get(3, rng), Contains("y.jpg"));

  // Folder errors.
  CHECK_THROWS_WITH(ImageFolder((tmp.path() / "val").string()), Contains("does not exist"));
  fs::create_directories(tmp.path() / "empty");
  CHECK_THROWS_WITH(ImageFolder((tmp.path() / "empty").string()), Contains("no class folders"));
  fs::create_directories(train / "emu");
  CHECK_THROWS_WITH(ImageFolder(train.string()), Contains("emu' has no .jpg/.jpeg/.png images"));
}

// ---- transforms ------------------------------------------------------------------------------

TEST_CASE("Resize and CenterCrop shapes and contents", "[data][transforms]") {
  Generator rng(0);
  CHECK(Resize(20)(gradient_image(40, 60, 3), rng).height == 20);
  CHECK(Resize(20)(gradient_image(40, 60, 3), rng).width == 30);
  CHECK(Resize(20)(gradient_image(61, 40, 1), rng).height == 30);  // 20 * 61 / 40 = 30.5
  CHECK(Resize(20)(gradient_image(61, 40, 1), rng).width == 20);
  const Image up = Resize(7, 9)(gradient_image(3, 4, 3), rng);
  CHECK((up.height == 7 && up.width == 9));
  // Weights are normalised: a constant image stays constant at any scale.
  for (int64_t size : {5, 33, 100}) {
    const Image r = Resize(size)(constant_image(47, 51, 3, 200), rng);
    for (uint8_t v : r.pixels) REQUIRE(int{v} == 200);
  }
  // Antialiasing: a 1-pixel checkerboard halved becomes flat grey, not a checkerboard.
  Image checker(32, 32, 1);
  for (int64_t y = 0; y < 32; ++y) {
    for (int64_t x = 0; x < 32; ++x) checker.row(y)[x] = ((x + y) % 2) ? 255 : 0;
  }
  const Image half = Resize(16)(checker, rng);
  for (int64_t y = 1; y < 15; ++y) {
    for (int64_t x = 1; x < 15; ++x) CHECK(std::abs(int{half.row(y)[x]} - 128) <= 1);
  }

  // CenterCrop takes the central window (torchvision rounding) and pads small images.
  const Image src = gradient_image(10, 13, 3);
  const Image crop = CenterCrop(6)(src, rng);
  REQUIRE((crop.height == 6 && crop.width == 6));
  // top = round(2.0) = 2, left = round(3.5) = 4 (half to even)
  for (int64_t y = 0; y < 6; ++y) {
    for (int64_t x = 0; x < 18; ++x) REQUIRE(crop.row(y)[x] == src.row(y + 2)[4 * 3 + x]);
  }
  const Image padded = CenterCrop(8)(constant_image(4, 6, 1, 9), rng);
  REQUIRE((padded.height == 8 && padded.width == 8));
  CHECK(int{padded.row(0)[0]} == 0);
  CHECK(int{padded.row(2)[1]} == 9);
  CHECK(int{padded.row(5)[6]} == 9);
  CHECK(int{padded.row(6)[7]} == 0);
  CHECK_THROWS_WITH(Resize(0), Contains("size must be positive"));

  // A 70-byte BMP header claims 1 x 16M pixels (stb fills what the file lacks); resized to a
  // short side of 18 it asked for a 16 GB image (fuzz_image: std::bad_alloc escaped).
  const std::string tall_bmp =
      std::string(DPAR_SOURCE_DIR) +
      "/tests/fuzz/regressions/fuzz_image/bmp-1x16M-resized-by-short-side.bmp";
  // A BMP's negative height (rows top-down) slipped past the pixel limit: stb decodes its
  // magnitude, 16384 x 32768 here (fuzz_image: out of memory).
  CHECK_THROWS_WITH(
      read_image(std::string(DPAR_SOURCE_DIR) + "/tests/fuzz/regressions/fuzz_image/"
                                                "bmp-top-down-claims-512M-pixels.bmp"),
      Contains("16384x32768 pixels is more than dpar decodes (67108864)"));
  CHECK_THROWS_WITH(read_image(tall_bmp, int64_t{1} << 20),
                    Contains("1x16777216 pixels is more than dpar decodes (1048576)"));
  CHECK_THROWS_WITH(read_image(tall_bmp, 0), Contains("max_pixels must be in 1..67108864, got 0"));
  const Image tall = read_image(tall_bmp);
  REQUIRE((tall.height == int64_t{1} << 24 && tall.width == 1));
  CHECK_THROWS_WITH(Resize(18)(tall, rng),
                    Contains("Resize: a 16777216x1 image resized to a short side of 18 would be "
                             "301989888x18 pixels, more than dpar handles (67108864)"));
  CHECK_THROWS_WITH(Resize(int64_t{1} << 40)(constant_image(4, 6, 1, 9), rng),
                    Contains("more than dpar handles"));
  CHECK_THROWS_WITH(Image(int64_t{1} << 14, int64_t{1} << 13, 3),
                    Contains("Image: 16384x8192 pixels is more than dpar handles (67108864)"));
  CHECK_THROWS_WITH(Image(int64_t{1} << 62, 4, 1), Contains("pixels is more than dpar handles"));
  CHECK(Image(int64_t{1} << 13, int64_t{1} << 13, 1).pixels.size() == size_t{1} << 26);
}

TEST_CASE("random transforms are driven by the generator only", "[data][transforms]") {
  const Image src = gradient_image(50, 70, 3);
  const RandomResizedCrop rrc(24);
  std::set<std::string> distinct;  // (strings: GCC 12 misreports sets of byte vectors)
  for (uint64_t seed = 0; seed < 8; ++seed) {
    Generator a(seed), b(seed);
    const Image x = rrc(src, a);
    const Image y = rrc(src, b);
    CHECK((x.height == 24 && x.width == 24 && x.channels == 3));
    CHECK(x.pixels == y.pixels);
    distinct.insert(std::string(x.pixels.begin(), x.pixels.end()));
  }
  CHECK(distinct.size() >= 6);

  Generator rng(3);
  const Image flipped = RandomHorizontalFlip(1.0)(src, rng);
  for (int64_t x = 0; x < 70; ++x) {
    for (int64_t ch = 0; ch < 3; ++ch) {
      REQUIRE(flipped.row(5)[x * 3 + ch] == src.row(5)[(69 - x) * 3 + ch]);
    }
  }
  CHECK(RandomHorizontalFlip(0.0)(src, rng).pixels == src.pixels);

  // The whole train pipeline, grey input: [3,S,S] with three equal channels.
  const Compose train = imagenet_train_transform(16);
  Generator g1(9), g2(9);
  const Tensor t1 = train(gradient_image(30, 20, 1), g1);
  const Tensor t2 = train(gradient_image(30, 20, 1), g2);
  REQUIRE(t1.shape() == Shape{3, 16, 16});
  CHECK(t1.is_contiguous());
  CHECK(t1.to_float_vector() == t2.to_float_vector());
  // Undo the per-channel normalisation: all three channels hold the same grey values.
  const std::vector<float> v = t1.to_float_vector();
  for (size_t i = 0; i < 256; ++i) {
    const float c0 = v[i] * 0.229f + 0.485f, c1 = v[256 + i] * 0.224f + 0.456f;
    REQUIRE(c0 == Approx(c1).margin(1e-5));
  }
  const Tensor n =
      ToTensorNormalize({0.5f, 0.5f, 0.5f}, {0.5f, 0.25f, 1.0f})(constant_image(2, 2, 3, 255));
  CHECK(n.to_float_vector() == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 0.5f, 0.5f, 0.5f, 0.5f});
}

// ---- samplers --------------------------------------------------------------------------------

TEST_CASE("samplers", "[data][sampler]") {
  CHECK(SequentialSampler(4).indices(3) == std::vector<size_t>{0, 1, 2, 3});
  RandomSampler rs(100, 42);
  const auto e0 = rs.indices(0), e1 = rs.indices(1);
  CHECK(e0 == rs.indices(0));
  CHECK(e0 != e1);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == SequentialSampler(100).indices(0));

  // 10 indices over 3 ranks: 4 each, padded by wrapping; together they cover everything.
  for (bool shuffle : {false, true}) {
    std::vector<size_t> all;
    for (int64_t r = 0; r < 3; ++r) {
      DistributedSampler ds(10, r, 3, shuffle, 7);
      CHECK(ds.size() == 4);
      const auto idx = ds.indices(2);
      CHECK(idx == DistributedSampler(10, r, 3, shuffle, 7).indices(2));
      CHECK(idx.size() == 4);
      all.insert(all.end(), idx.begin(), idx.end());
    }
    std::set<size_t> unique(all.begin(), all.end());
    CHECK(unique.size() == 10);
    CHECK(all.size() == 12);
    if (!shuffle)
      CHECK(DistributedSampler(10, 1, 3, false).indices(0) == std::vector<size_t>{1, 4, 7, 0});
  }
  CHECK(DistributedSampler(10, 0, 3, true, 7).indices(0) !=
        DistributedSampler(10, 0, 3, true, 7).indices(1));
  CHECK_THROWS_WITH(DistributedSampler(10, 3, 3), Contains("rank 3 out of range"));

  // SkipSampler: the rest of one interrupted epoch, in the base's order.
  auto base = std::make_shared<DistributedSampler>(10, 1, 2, true, 7);
  SkipSampler rest(base, 3, 2);
  CHECK(rest.size() == 3);
  const std::vector<size_t> full = base->indices(3);
  CHECK(rest.indices(3) == std::vector<size_t>(full.begin() + 2, full.end()));
  CHECK(SkipSampler(base, 3, 5).indices(3).empty());
  CHECK_THROWS_WITH(rest.indices(4), Contains("built for epoch 3, asked for epoch 4"));
  CHECK_THROWS_WITH(SkipSampler(base, 3, 6), Contains("cannot start at position 6 of 5"));
}

// ---- DataLoader ------------------------------------------------------------------------------

namespace {

std::vector<Batch> run_epoch(DataLoader& loader, int64_t epoch) {
  std::vector<Batch> out;
  for (Batch& b : loader.epoch(epoch)) out.push_back(std::move(b));
  return out;
}

// Fails on one index; optionally slow, to keep workers busy.
class FlakyDataset : public Dataset {
 public:
  FlakyDataset(size_t n, size_t bad, int delay_ms = 0) : n_(n), bad_(bad), delay_ms_(delay_ms) {}
  size_t size() const override { return n_; }
  Example get(size_t index, Generator& rng) const override {
    if (delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    if (index == bad_) DPAR_FAIL("cannot decode image 'broken.jpg'");
    return {Tensor::full({3, 2, 2}, static_cast<double>(rng.uniform())),
            static_cast<int64_t>(index % 3)};
  }
  std::vector<std::string> class_names() const override { return {"a", "b", "c"}; }

 private:
  size_t n_, bad_;
  int delay_ms_;
};

}  // namespace

TEST_CASE("DataLoader batches are identical for any number of workers", "[data][loader]") {
  auto ds = fashion_subset(203, imagenet_train_transform(20));
  auto sampler = std::make_shared<RandomSampler>(ds->size(), 5);
  std::vector<std::vector<Batch>> runs;
  for (int workers : {0, 1, 3}) {
    DataLoader loader(ds, sampler,
                      DataLoaderOptions{.batch_size = 16,
                                        .num_workers = workers,
                                        .prefetch_batches = workers == 3 ? 1u : 4u,
                                        .seed = 11});
    CHECK(loader.num_batches() == 13);
    runs.push_back(run_epoch(loader, 1));
    // A second epoch reshuffles and re-augments.
    const auto next = run_epoch(loader, 2);
    REQUIRE(next.size() == 13);
    CHECK(next[0].indices != runs.back()[0].indices);
  }
  const auto order = sampler->indices(1);
  for (const auto& run : runs) {
    REQUIRE(run.size() == 13);
    CHECK(run.back().size() == 203 - 12 * 16);
    for (size_t b = 0; b < run.size(); ++b) {
      const Batch& batch = run[b];
      CHECK(batch.images.shape() == Shape{static_cast<int64_t>(batch.size()), 3, 20, 20});
      CHECK(batch.images.is_contiguous());
      CHECK(batch.labels.dtype() == DType::i64);
      const auto labels = batch.labels.to_int_vector();
      for (size_t k = 0; k < batch.size(); ++k) {
        REQUIRE(batch.indices[k] == order[b * 16 + k]);
        REQUIRE(labels[k] == ds->label(batch.indices[k]));
      }
      // Bitwise equal to the single-threaded run.
      CHECK(batch.images.to_float_vector() == runs[0][b].images.to_float_vector());
    }
  }
  // Any sample can be reproduced from its seed.
  Generator rng(DataLoader::sample_seed(11, 1, runs[0][2].indices[3]));
  const Tensor one = ds->get(runs[0][2].indices[3], rng).image;
  const std::vector<float> all = runs[0][2].images.to_float_vector();
  CHECK(std::vector<float>(all.begin() + 3 * 1200, all.begin() + 4 * 1200) ==
        one.to_float_vector());

  DataLoader dropping(ds, std::make_shared<SequentialSampler>(ds->size()), 16, 2, 2,
                      /*drop_last=*/true);
  CHECK(dropping.num_batches() == 12);
  CHECK(run_epoch(dropping, 0).size() == 12);
}

TEST_CASE("DataLoader re-throws worker errors with the sample index", "[data][loader]") {
  auto ds = std::make_shared<FlakyDataset>(40, 13);
  for (int workers : {0, 2}) {
    DataLoader loader(ds, std::make_shared<SequentialSampler>(40),
                      DataLoaderOptions{.batch_size = 4, .num_workers = workers});
    loader.start_epoch(0);
    for (int b = 0; b < 3; ++b) CHECK(loader.next().has_value());
    try {
      loader.next();
      FAIL("expected an error from sample 13");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Contains("sample 13") && Contains("broken.jpg"));
    }
    CHECK_FALSE(loader.next().has_value());  // the failed epoch is over
    // The loader stays usable: an epoch that avoids the bad sample runs through.
    DataLoader other(ds, std::make_shared<SequentialSampler>(12), 4, workers);
    CHECK(run_epoch(other, 0).size() == 3);
  }
  // The range-for form throws too.
  DataLoader loader(ds, std::make_shared<SequentialSampler>(40), 4, 3);
  CHECK_THROWS_WITH(run_epoch(loader, 0), Contains("sample 13"));
  // A sampler producing out-of-range indices is caught up front.
  DataLoader bad(ds, std::make_shared<SequentialSampler>(41), 4, 1);
  CHECK_THROWS_WITH(bad.start_epoch(0), Contains("index 40 for a dataset of 40"));
}

TEST_CASE("DataLoader shuts down cleanly mid-epoch", "[data][loader]") {
  auto ds = std::make_shared<FlakyDataset>(1000, 100000, /*delay_ms=*/2);
  const auto t0 = std::chrono::steady_clock::now();
  {
    DataLoader loader(ds, std::make_shared<RandomSampler>(1000, 1),
                      DataLoaderOptions{.batch_size = 8, .num_workers = 3, .prefetch_batches = 6});
    loader.start_epoch(0);
    CHECK(loader.next().has_value());
    // Leaving a range-for early and starting again abandons the previous epoch.
    for (Batch& b : loader.epoch(1)) {
      CHECK(b.size() == 8);
      break;
    }
    loader.start_epoch(2);
  }  // destroyed with workers busy
  // Never started: destroying must not block either.
  { DataLoader idle(ds, std::make_shared<SequentialSampler>(1000), 8, 2); }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds < 2.0);  // a full epoch would take 1000 * 2 ms / 3 workers
}

TEST_CASE("EpochRemainderSampler: the rest of an epoch's order, split over another world size",
          "[data]") {
  constexpr size_t n = 103;
  // A job of 2 ranks took 5 batches of 4 each: positions 0..39 of the epoch's order.
  auto shape2 = std::make_shared<DistributedSampler>(n, 0, 2, true, 11);
  const std::vector<size_t> order = shape2->epoch_order(3);
  std::vector<size_t> taken;
  for (int64_t r = 0; r < 2; ++r) {
    const auto idx = DistributedSampler(n, r, 2, true, 11).indices(3);
    taken.insert(taken.end(), idx.begin(), idx.begin() + 20);
  }
  std::sort(taken.begin(), taken.end());
  std::vector<size_t> prefix(order.begin(), order.begin() + 40);
  std::sort(prefix.begin(), prefix.end());
  CHECK(taken == prefix);  // the consumed samples are a prefix of the order
  // Three ranks continue from position 40: together exactly the rest (63 samples, 21 each).
  std::multiset<size_t> rest;
  for (int64_t r = 0; r < 3; ++r) {
    EpochRemainderSampler s(std::make_shared<DistributedSampler>(n, r, 3, true, 11), 3, 40);
    CHECK(s.size() == 21);
    const auto idx = s.indices(3);
    rest.insert(idx.begin(), idx.end());
  }
  CHECK(rest == std::multiset<size_t>(order.begin() + 40, order.end()));
  // Nothing consumed: the plain sampler's indices; an uneven rest pads by wrapping.
  auto plain = std::make_shared<DistributedSampler>(n, 1, 4, true, 11);
  CHECK(EpochRemainderSampler(plain, 3, 0).indices(3) == plain->indices(3));
  EpochRemainderSampler padded(std::make_shared<DistributedSampler>(n, 3, 4, true, 11), 3, 100);
  CHECK(padded.indices(3) == std::vector<size_t>{order[100]});  // positions 103 -> 100
  CHECK_THROWS_WITH(padded.indices(4), Contains("built for epoch 3"));
}
