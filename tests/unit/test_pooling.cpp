// max_pool2d, avg_pool2d and adaptive_avg_pool2d: values against hand-computed windows,
// output sizes (ceil mode, padding), gradients against finite differences in both layouts.
#include <catch2/catch.hpp>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using Catch::Matchers::Contains;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

namespace {
// 0..15 in a 4x4 plane.
Tensor ramp() {
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return Tensor::from_vector(v, {1, 1, 4, 4});
}

}  // namespace

TEST_CASE("pooling values and output sizes follow torch", "[pool]") {
  const Tensor x = ramp();
  CHECK(max_pool2d(x, {2}).to_float_vector() == std::vector<float>{5, 7, 13, 15});
  CHECK(avg_pool2d(x, {2}).to_float_vector() == std::vector<float>{2.5, 4.5, 10.5, 12.5});
  // 3x3 stride 2 padding 1: corner windows see 4 real values; with the padding counted the
  // divisor is 9, without it 4.
  CHECK(max_pool2d(x, {3}, {2}, {1}).to_float_vector() == std::vector<float>{5, 7, 13, 15});
  CHECK(avg_pool2d(x, {3}, {2}, {1}).to_float_vector()[0] == Approx((0 + 1 + 4 + 5) / 9.0));
  CHECK(avg_pool2d(x, {3}, {2}, {1}, false, false).to_float_vector()[0] ==
        Approx((0 + 1 + 4 + 5) / 4.0));
  // ceil_mode: 4 -> 2 with k3 s2 (floor gives 1).
  CHECK(max_pool2d(x, {3}, {2}).shape() == Shape{1, 1, 1, 1});
  CHECK(max_pool2d(x, {3}, {2}, {0}, true).shape() == Shape{1, 1, 2, 2});
  CHECK(max_pool2d(x, {3}, {2}, {0}, true).to_float_vector() == std::vector<float>{10, 11, 14, 15});
  // Non-square kernels and strides.
  CHECK(max_pool2d(x, {1, 2}, {1, 2}).shape() == Shape{1, 1, 4, 2});
  // Adaptive: 4 -> 3 windows [0,2) [1,3) [2,4); 4 -> 1 is the global mean.
  const Tensor a = adaptive_avg_pool2d(x, {3, 1});
  CHECK(a.shape() == Shape{1, 1, 3, 1});
  CHECK(a.to_float_vector() == std::vector<float>{3.5, 7.5, 11.5});
  CHECK(adaptive_avg_pool2d(x, {1}).item() == Approx(7.5));
  // Channels-last in, channels-last out, same values.
  const Tensor cl =
      dpar::testing::distinct_values({2, 3, 5, 5}, 1, -2.f, MemoryFormat::ChannelsLast);
  CHECK(max_pool2d(cl, {2}).is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(max_pool2d(cl, {2}).to_float_vector() ==
        max_pool2d(cl.contiguous(), {2}).to_float_vector());

  CHECK_THROWS_WITH(max_pool2d(x, {3}, {1}, {2}), Contains("at most half the kernel size"));
  CHECK_THROWS_WITH(max_pool2d(x, {5}), Contains("is smaller than the 5x5 window"));
  CHECK_THROWS_WITH(avg_pool2d(x.view({4, 4}), {2}), Contains("expected a 4-D input"));
}

TEST_CASE("pooling gradients match finite differences", "[pool][gradcheck]") {
  for (const MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    INFO("channels-last " << (format == MemoryFormat::ChannelsLast));
    gradcheck([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {3}, {2}, {1}); },
              {dpar::testing::distinct_values({2, 2, 5, 6}, 2, -2.f, format).set_requires_grad()});
    gradcheck([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {3}, {2}, {0}, true); },
              {dpar::testing::distinct_values({1, 2, 6, 6}, 3, -2.f, format).set_requires_grad()});
    Generator gen(4);
    gradcheck(
        [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {3}, {2}, {1}, true, false); },
        {random_tensor({2, 2, 5, 6}, gen, -1, 1, format).set_requires_grad()});
    gradcheck(
        [](const std::vector<Tensor>& in) {
          return avg_pool2d(in[0], {2, 3}, {1, 2});
        },
        {random_tensor({1, 2, 4, 7}, gen, -1, 1, format).set_requires_grad()});
    gradcheck(
        [](const std::vector<Tensor>& in) {
          return adaptive_avg_pool2d(in[0], {3, 2});
        },
        {random_tensor({2, 2, 7, 5}, gen, -1, 1, format).set_requires_grad()});
  }
}
