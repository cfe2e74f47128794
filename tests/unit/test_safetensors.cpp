#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "dpar/dpar.h"
#include "dpar/io/safetensors.h"
#include "dpar/nn/layers.h"
#include "dpar/nn/weights.h"
#include "unit/helpers.h"

using namespace dpar;
namespace fs = std::filesystem;

namespace {

std::string bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  const char* p = static_cast<const char*>(c.raw_data());
  return c.numel() ? std::string(p, p + c.nbytes()) : std::string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
}

// A file with the given header text and data bytes; the length field is the header's unless
// given.
std::string make_file(const std::string& header, const std::string& data,
                      uint64_t length_field = UINT64_MAX) {
  uint64_t n = length_field == UINT64_MAX ? header.size() : length_field;
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// Loading must fail with a dpar::Error naming the file and containing `problem`.
void expect_load_error(const std::string& path, const std::string& contents,
                       const std::string& problem) {
  write_file(path, contents);
  INFO("expected problem: " << problem);
  try {
    io::load_safetensors(path);
    FAIL("load_safetensors accepted a corrupt file");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains(path));
    CHECK_THAT(msg, Catch::Contains(problem));
  }
}

}  // namespace

TEST_CASE("safetensors round trip is bitwise and keeps order", "[io][safetensors]") {
  TempDir dir;
  Generator gen(3);
  std::vector<float> values(2 * 3 * 4 * 5);
  for (float& v : values) v = gen.normal();
  Tensor nchw = Tensor::from_vector(values, {2, 3, 4, 5});
  Tensor channels_last = nchw.contiguous(MemoryFormat::ChannelsLast);
  Tensor transposed = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3})
                          .transpose(0, 1);  // a non-contiguous view
  io::NamedTensors tensors = {
      {"z.last", channels_last},
      {"a.first", transposed},
      {"half", nchw.to(DType::f16)},
      {"brain", nchw.to(DType::bf16)},
      {"count", Tensor::from_vector(std::vector<int64_t>{-3, 1ll << 40, 7}, {3})},
      {"scalar", Tensor::full({}, 42, DType::i64)},
      {"bytes", Tensor::full({5}, 200, DType::u8)},
      {"empty", Tensor::empty({0, 4})},
  };
  const std::string path = dir.file("weights.safetensors");
  io::save_safetensors(path, tensors, {{"format", "pt"}, {"epoch", "3"}});
  CHECK_FALSE(fs::exists(path + ".tmp"));

  io::SafetensorsContents loaded = io::load_safetensors(path);
  CHECK(loaded.metadata == io::Metadata{{"epoch", "3"}, {"format", "pt"}});
  REQUIRE(loaded.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, original] = tensors[i];
    const auto& [lname, t] = loaded.tensors[i];
    INFO(name);
    CHECK(lname == name);
    CHECK(t.dtype() == original.dtype());
    CHECK(t.shape() == original.shape());
    CHECK(t.is_contiguous());
    CHECK(bytes_of(t) == bytes_of(original));
  }
  CHECK(loaded.tensors[1].second.to_float_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(loaded.tensors[5].second.item() == 42);

  // The layout on disk: 8-byte length, JSON padded to a multiple of 8, data in save order.
  const std::string raw = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  CHECK(n % 8 == 0);
  auto header = nlohmann::json::parse(raw.substr(8, n));
  CHECK(header["__metadata__"]["format"] == "pt");
  CHECK(header["z.last"]["dtype"] == "F32");
  CHECK(header["z.last"]["shape"] == nlohmann::json::array({2, 3, 4, 5}));
  CHECK(header["z.last"]["data_offsets"] == nlohmann::json::array({0, 480}));
  CHECK(header["a.first"]["data_offsets"] == nlohmann::json::array({480, 504}));
  CHECK(header["brain"]["dtype"] == "BF16");
  CHECK(header["scalar"]["shape"] == nlohmann::json::array());
  CHECK(raw.substr(8 + n, 480) == bytes_of(channels_last));

  // Overwriting replaces the file atomically.
  io::save_safetensors(path, {{"only", Tensor::ones({1})}});
  CHECK(io::load_safetensors(path).tensors.size() == 1);
  CHECK(io::load_safetensors(path).metadata.empty());
}

TEST_CASE("save_safetensors rejects bad input without leaving files", "[io][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  CHECK_THROWS_WITH(
      io::save_safetensors(path, {{"a", Tensor::ones({1})}, {"a", Tensor::ones({1})}}),
      Catch::Contains("tensor 'a' appears twice"));
  CHECK_THROWS_WITH(io::save_safetensors(path, {{"__metadata__", Tensor::ones({1})}}),
                    Catch::Contains("invalid tensor name '__metadata__'"));
  CHECK_THROWS_WITH(io::save_safetensors(path, {{"u", Tensor()}}),
                    Catch::Contains("'u' is undefined"));
  CHECK_THROWS_WITH(
      io::save_safetensors(dir.file("missing_dir/x.safetensors"), {{"a", Tensor::ones({1})}}),
      Catch::Contains("cannot create"));
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("load_safetensors reports every kind of corruption", "[io][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("corrupt.safetensors");
  const std::string f32x2 = std::string(8, '\0');  // 2 floats of data

  expect_load_error(dir.file("absent.safetensors"), "", "truncated");
  CHECK_THROWS_WITH(io::load_safetensors(dir.file("never_written.safetensors")),
                    Catch::Contains("cannot open"));
  expect_load_error(path, "abc", "truncated: 3 bytes");
  expect_load_error(path, make_file("{}", "", 1000), "header length 1000 exceeds");
  expect_load_error(path, make_file("{}", "", UINT64_MAX - 1), "exceeds");
  expect_load_error(path, make_file("{\"a\": ", ""), "invalid JSON header");
  expect_load_error(path, make_file("[1, 2]", ""), "not a JSON object");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", f32x2),
                    "tensor 'a': unsupported dtype \"F64\"");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"WHAT","shape":[2],"data_offsets":[0,8]}})", f32x2),
                    "unsupported dtype \"WHAT\"");
  expect_load_error(path, make_file(R"({"a":{"dtype":"F32","shape":[2]}})", f32x2),
                    "tensor 'a': missing \"data_offsets\"");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2),
                    "shape entry must be a non-negative integer");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", f32x2),
                    "non-negative integer");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", f32x2),
                    "data_offsets must be [begin, end]");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2),
                    "end before begin");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2),
                    "needs 3 x 4 bytes, but data_offsets [0,8] span 8");
  expect_load_error(
      path,
      make_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
                f32x2),
      "too large");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32x2),
                    "run past the 8 data bytes");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              f32x2 + "abcd"),
                    "tensor 'b' [4, 8) overlaps tensor 'a' [0, 8)");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2),
                    "data bytes [0, 4) belong to no tensor");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32x2),
                    "data bytes [4, 8) belong to no tensor");
  expect_load_error(path,
                    make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              f32x2),
                    "tensor 'a' appears twice");
  expect_load_error(path, make_file(R"({"a":[1]})", ""), "tensor 'a': expected an object");
  expect_load_error(path, make_file(R"({"__metadata__":{"k":1}})", ""),
                    "__metadata__ value of 'k' must be a string");
  expect_load_error(path, make_file(R"({"__metadata__":[]})", ""),
                    "__metadata__ must be an object");

  // A valid minimal file still loads (sanity check of make_file).
  write_file(path, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2));
  CHECK(io::load_safetensors(path).tensors.at(0).second.to_float_vector() ==
        std::vector<float>{0, 0});
}

TEST_CASE("damaged real files never crash the loader", "[io][safetensors]") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  io::save_safetensors(good,
                       {{"w", Tensor::ones({3, 4})},
                        {"n", Tensor::full({2}, 5, DType::i64)},
                        {"h", Tensor::ones({3}).to(DType::f16)}},
                       {{"k", "v"}});
  const std::string raw = read_file(good);
  const std::string bad = dir.file("bad.safetensors");
  // Every truncation is an error with the file's name.
  for (size_t len = 0; len < raw.size(); ++len) {
    write_file(bad, raw.substr(0, len));
    INFO("truncated to " << len << " of " << raw.size() << " bytes");
    CHECK_THROWS_AS(io::load_safetensors(bad), Error);
  }
  // Flipping any header byte either still parses to a consistent file or is a dpar::Error.
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  size_t rejected = 0;
  for (size_t pos = 0; pos < 8 + n; ++pos) {
    for (unsigned char flip : {0x01, 0x20, 0x80}) {
      std::string damaged = raw;
      damaged[pos] = static_cast<char>(static_cast<unsigned char>(damaged[pos]) ^ flip);
      write_file(bad, damaged);
      try {
        io::load_safetensors(bad);
      } catch (const Error& e) {
        ++rejected;
        CHECK_THAT(std::string(e.what()), Catch::Contains(bad));
      }
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("save_weights / load_weights move a module's state by name", "[io][nn]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  manual_seed(11);
  nn::Sequential a{std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::BatchNorm2d>(3)};
  a.at<nn::BatchNorm2d>(1)->num_batches_tracked.fill_(17);
  nn::save_weights(a, path, {{"arch", "test"}});
  CHECK(io::load_safetensors(path).metadata.at("arch") == "test");

  manual_seed(12);
  nn::Sequential b{std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::BatchNorm2d>(3)};
  Tensor w = b.at<nn::Linear>(0)->weight;
  CHECK(nn::load_weights(b, path).ok());
  CHECK(b.at<nn::Linear>(0)->weight.is_same(w));
  const auto sa = a.state_dict(), sb = b.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    CHECK(sa[i].first == sb[i].first);
    CHECK(bytes_of(sa[i].second) == bytes_of(sb[i].second));
  }
  CHECK(b.at<nn::BatchNorm2d>(1)->num_batches_tracked.item() == 17);

  // A different architecture: strict names the file and every problem; nothing changes.
  nn::Sequential c{std::make_shared<nn::Linear>(4, 5), std::make_shared<nn::ReLU>(),
                   std::make_shared<nn::BatchNorm2d>(3)};
  const auto before = c.at<nn::BatchNorm2d>(2)->running_var.to_float_vector();
  try {
    nn::load_weights(c, path);
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains(path));
    CHECK_THAT(msg,
               Catch::Contains("shape mismatch: 0.weight: module has [5,4], source has [3,4]"));
    CHECK_THAT(msg, Catch::Contains("shape mismatch: 0.bias"));
    CHECK_THAT(msg, Catch::Contains("missing: 2.running_var"));
    CHECK_THAT(msg, Catch::Contains("unexpected: 1.running_var"));
  }
  CHECK(c.at<nn::BatchNorm2d>(2)->running_var.to_float_vector() == before);
  nn::LoadReport report = nn::load_weights(c, path, /*strict=*/false);
  CHECK(report.mismatched.size() == 2);
  CHECK(report.missing.size() == 5);
  CHECK(report.unexpected.size() == 5);
}

TEST_CASE("safetensors files interchange with Python", "[io][safetensors][python]") {
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0 ||
      std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    WARN("skipped: /usr/bin/python3 with numpy is not available");
    return;
  }
  TempDir dir;
  const std::string from_cpp = dir.file("from_cpp.safetensors");
  const std::string from_py = dir.file("from_py.safetensors");
  io::save_safetensors(from_cpp,
                       {{"w", Tensor::from_vector(std::vector<float>{1.5f, -2, 3, 4}, {2, 2})},
                        {"i", Tensor::from_vector(std::vector<int64_t>{7, -8}, {2})}});
  const std::string script = "import sys; sys.path.insert(0, '" DPAR_SOURCE_DIR
                             "/tests/parity'); "
                             "import numpy as np, safetensors_io as st; "
                             "d = st.load('" +
                             from_cpp +
                             "'); "
                             "assert d['w'].tolist() == [[1.5, -2.0], [3.0, 4.0]], d['w']; "
                             "assert d['i'].tolist() == [7, -8], d['i']; "
                             "st.save('" +
                             from_py +
                             "', {'b': np.arange(6, dtype=np.float32).reshape(3, 2), "
                             "'c': np.array([1, 2, 3], dtype=np.uint8)}, {'who': 'python'})";
  REQUIRE(std::system((std::string(python) + " -c \"" + script + "\"").c_str()) == 0);
  io::SafetensorsContents loaded = io::load_safetensors(from_py);
  REQUIRE(loaded.tensors.size() == 2);
  CHECK(loaded.tensors[0].first == "b");
  CHECK(loaded.tensors[0].second.shape() == Shape{3, 2});
  CHECK(loaded.tensors[0].second.to_float_vector() == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(loaded.tensors[1].second.dtype() == DType::u8);
  CHECK(loaded.metadata.at("who") == "python");
}
