// dpar::infer's own global average pooling (infer/global_pool.h) in every layout it reads:
// against a double sum, with the padded channels of the blocked layouts zero and the same bits
// at any thread count; and in a model, whose plan uses it in place of oneDNN's pooling.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "dpar/dpar.h"
#include "dpar/infer/runtime.h"
#include "dpar/io/onnx_export.h"
#include "infer/global_pool.h"
#include "infer/plan_util.h"

namespace {

using namespace dpar;
using dnnl::memory;
using infer::detail::engine;
using infer::detail::global_average_pool;
using infer::detail::global_pool_layout;
using infer::detail::global_pool_output_md;
using infer::detail::stream;
using tag = memory::format_tag;

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(gen);
  return v;
}

struct Pooled {
  std::vector<float> raw;    // the output's bytes as the pool wrote them, padding included
  std::vector<float> plain;  // [N, C]
};

// x (plain NCHW) reordered to `layout` by oneDNN (which zeroes blocked padding), then pooled.
Pooled pool_in_layout(const std::vector<float>& x, const memory::dims& dims, tag layout) {
  const memory::desc plain_md(dims, memory::data_type::f32, tag::nchw);
  const memory::desc laid_md(dims, memory::data_type::f32, layout);
  memory plain(plain_md, engine(), const_cast<float*>(x.data()));
  memory laid(laid_md, engine());
  dnnl::reorder(plain, laid).execute(stream(), plain, laid);
  stream().wait();
  const auto pool_layout = global_pool_layout(laid_md);
  REQUIRE(pool_layout.has_value());
  const memory::desc out_md = global_pool_output_md(laid_md);
  memory out(out_md, engine());
  float* out_data = static_cast<float*>(out.get_data_handle());
  const size_t out_floats = out_md.get_size() / sizeof(float);
  // NaN everywhere first, so an element the pool leaves unwritten shows.
  std::fill(out_data, out_data + out_floats, std::numeric_limits<float>::quiet_NaN());
  global_average_pool(static_cast<const float*>(laid.get_data_handle()), out_data, dims,
                      *pool_layout);
  Pooled result;
  result.raw.assign(out_data, out_data + out_floats);
  result.plain.resize(static_cast<size_t>(dims[0] * dims[1]));
  memory plain_out(memory::desc({dims[0], dims[1], 1, 1}, memory::data_type::f32, tag::nchw),
                   engine(), result.plain.data());
  dnnl::reorder(out, plain_out).execute(stream(), out, plain_out);
  stream().wait();
  return result;
}

const tag kLayouts[] = {tag::nChw8c, tag::nChw16c, tag::nchw, tag::nhwc};

TEST_CASE("dpar::infer's global average pool matches a double sum in every layout it reads") {
  // 20 channels: a partial block in nChw8c and nChw16c; 7x5 maps: no multiple of the 4 (or 8)
  // interleaved partial sums.
  const memory::dims dims = {3, 20, 7, 5};
  const int64_t N = dims[0], C = dims[1], HW = dims[2] * dims[3];
  const std::vector<float> x = uniform(static_cast<size_t>(N * C * HW), 7);
  for (const tag layout : kLayouts) {
    INFO("layout " << static_cast<int>(layout));
    const Pooled y = pool_in_layout(x, dims, layout);
    for (int64_t nc = 0; nc < N * C; ++nc) {
      double sum = 0;
      for (int64_t p = 0; p < HW; ++p) sum += x[static_cast<size_t>(nc * HW + p)];
      CHECK(std::abs(y.plain[static_cast<size_t>(nc)] - sum / static_cast<double>(HW)) < 1e-6);
    }
    // Blocked layouts: the padded channels of every block are written, as zeros.
    const int64_t block = layout == tag::nChw8c ? 8 : layout == tag::nChw16c ? 16 : 1;
    const int64_t padded = (C + block - 1) / block * block;
    REQUIRE(static_cast<int64_t>(y.raw.size()) == N * padded);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = C; c < padded; ++c) {
        const int64_t at = n * padded + c / block * block + c % block;
        CHECK(y.raw[static_cast<size_t>(at)] == 0.0f);
      }
    }
  }
}

TEST_CASE("dpar::infer's global average pool has the same bits at 1, 2 and 3 threads") {
  // Large enough to run threaded (above 32768 elements).
  const memory::dims dims = {5, 40, 30, 29};
  const std::vector<float> x = uniform(static_cast<size_t>(5 * 40 * 30 * 29), 11);
  const int threads_before = get_num_threads();
  for (const tag layout : kLayouts) {
    INFO("layout " << static_cast<int>(layout));
    set_num_threads(1);
    const Pooled one = pool_in_layout(x, dims, layout);
    for (int threads : {2, 3}) {
      set_num_threads(threads);
      const Pooled many = pool_in_layout(x, dims, layout);
      CHECK(std::memcmp(one.raw.data(), many.raw.data(), one.raw.size() * sizeof(float)) == 0);
    }
  }
  set_num_threads(threads_before);
}

TEST_CASE("layouts the own pool does not read stay with oneDNN's pooling") {
  const memory::dims dims = {2, 8, 4, 4};
  CHECK_FALSE(global_pool_layout(memory::desc(dims, memory::data_type::u8, tag::nhwc)));
  CHECK_FALSE(global_pool_layout(memory::desc(dims, memory::data_type::f32, tag::nChw4c)));
  CHECK_FALSE(global_pool_layout(memory::desc(dims, memory::data_type::f32, tag::acbd)));
  CHECK_FALSE(global_pool_layout(memory::desc({2, 8, 4}, memory::data_type::f32, tag::ncw)));
}

TEST_CASE("a model's GlobalAveragePool runs on the own pool, like the eager model") {
  // 20 channels after the convolution: oneDNN's blocked layout pads them to a whole block.
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 20, 3, 1, 1), std::make_shared<nn::Hardswish>(),
      std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(20, 6)});
  net->eval();
  io::OnnxExportOptions options;
  options.model_name = "pool";
  options.height = 9;
  options.width = 11;
  options.softmax = false;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dpar_test_infer_pool_" + std::to_string(getpid()));
  const io::OnnxExportResult exported = io::export_onnx(*net, dir.string(), options);
  infer::Model model = infer::Model::load(exported.model_path);
  std::vector<float> xv = uniform(4 * 3 * 9 * 11, 3);
  const Tensor x = Tensor::from_vector(xv, {4, 3, 9, 11});
  std::string plan;
  for (const std::string& line : model.plan_summary(x.shape())) plan += line + "\n";
  INFO(plan);
  CHECK(plan.find("pooling dpar:global_average") != std::string::npos);
  Tensor expected;
  {
    NoGradGuard no_grad;
    expected = net->forward(x);
  }
  const Tensor got = model.run(x);
  REQUIRE(got.shape() == expected.shape());
  const std::vector<float> a = got.to_float_vector(), b = expected.to_float_vector();
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) < 1e-5);
  std::filesystem::remove_all(dir);
}

}  // namespace
