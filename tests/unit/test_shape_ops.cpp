// cat / stack / split / chunk, N-d matmul with batch broadcasting, linear on [..., C] and
// BatchNorm1d shapes: values, gradients against finite differences, errors.
#include <catch2/catch.hpp>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using Catch::Matchers::Contains;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

namespace {
Tensor f32(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}
}  // namespace

TEST_CASE("cat and stack join; split and chunk are views; gradients route back", "[shape]") {
  const Tensor a = f32({1, 2, 3, 4}, {2, 2}), b = f32({5, 6}, {2, 1});
  CHECK(cat({a, b}, 1).to_float_vector() == std::vector<float>{1, 2, 5, 3, 4, 6});
  CHECK(cat({a, a}, 0).shape() == Shape{4, 2});
  CHECK(cat({a, b.transpose(0, 1)}, 0).to_float_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(stack({a, a}, 2).shape() == Shape{2, 2, 2});
  CHECK(stack({a, a}, 0).to_float_vector() == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});
  const Tensor ids = cat({Tensor::from_vector(std::vector<int64_t>{1}, {1}),
                          Tensor::from_vector(std::vector<int64_t>{7, 8}, {2})});
  CHECK(ids.to_int_vector() == std::vector<int64_t>{1, 7, 8});
  // Channels-last inputs give a channels-last result (a CNN's concatenation of branches).
  Generator gen(1);
  const Tensor nhwc = random_tensor({2, 3, 4, 4}, gen, -1, 1, MemoryFormat::ChannelsLast);
  CHECK(cat({nhwc, nhwc}, 1).is_contiguous(MemoryFormat::ChannelsLast));

  const Tensor x = f32({0, 1, 2, 3, 4, 5, 6}, {7});
  const auto parts = split(x, 3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[2].to_float_vector() == std::vector<float>{6});
  CHECK(split(x, std::vector<int64_t>{2, 5})[1].to_float_vector() ==
        std::vector<float>{2, 3, 4, 5, 6});
  CHECK(chunk(x, 3).size() == 3);
  CHECK(chunk(x, 3)[0].to_float_vector() == std::vector<float>{0, 1, 2});
  CHECK(chunk(f32({1, 2, 3, 4, 5, 6}, {6}), 4).size() == 3);  // torch.chunk gives fewer here

  gradcheck(
      [](const std::vector<Tensor>& in) {
        return cat({in[0], in[1], in[0]}, 1);
      },
      {random_tensor({2, 3, 2}, gen).set_requires_grad(),
       random_tensor({2, 1, 2}, gen).set_requires_grad()});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return stack({in[0], in[1]}, 1);
      },
      {random_tensor({3, 2}, gen).set_requires_grad(),
       random_tensor({3, 2}, gen).set_requires_grad()});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        auto p = chunk(in[0], 3, 1);
        return p[0] * p[2];
      },
      {random_tensor({2, 6}, gen).set_requires_grad()});

  CHECK_THROWS_WITH(cat({a, f32({1, 2, 3}, {1, 3})}, 0), Contains("they differ in dim 1"));
  CHECK_THROWS_WITH(cat({}, 0), Contains("at least one tensor"));
  CHECK_THROWS_WITH(stack({a, b}), Contains("stack needs equal shapes"));
  CHECK_THROWS_WITH(split(x, std::vector<int64_t>{2, 2}), Contains("sizes sum to 4"));
}

TEST_CASE("matmul: batched with broadcasting, 3-D x 2-D, vectors; linear on [..., C]",
          "[shape][matmul]") {
  Generator gen(2);
  // [2,1,3,4] x [3,4,5] -> [2,3,3,5]: each batch pair a plain product.
  const Tensor a = random_tensor({2, 1, 3, 4}, gen), b = random_tensor({3, 4, 5}, gen);
  const Tensor c = matmul(a, b);
  REQUIRE(c.shape() == Shape{2, 3, 3, 5});
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      const Tensor ref =
          matmul(a.select(0, i).select(0, 0).contiguous(), b.select(0, j).contiguous());
      CHECK(c.select(0, i).select(0, j).contiguous().to_float_vector() == ref.to_float_vector());
    }
  }
  CHECK(matmul(random_tensor({2, 3, 4}, gen), random_tensor({4, 6}, gen)).shape() ==
        Shape{2, 3, 6});
  CHECK(matmul(random_tensor({4}, gen), random_tensor({4, 6}, gen)).shape() == Shape{6});
  CHECK(matmul(random_tensor({2, 3, 4}, gen), random_tensor({4}, gen)).shape() == Shape{2, 3});
  gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
            {random_tensor({2, 1, 3, 4}, gen).set_requires_grad(),
             random_tensor({3, 4, 2}, gen).set_requires_grad()});
  gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
            {random_tensor({2, 3, 4}, gen).set_requires_grad(),
             random_tensor({4, 2}, gen).set_requires_grad()});
  // Attention's shapes: q k^T with k a transposed view.
  gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1].transpose(-2, -1)); },
            {random_tensor({2, 2, 3, 4}, gen).set_requires_grad(),
             random_tensor({2, 2, 5, 4}, gen).set_requires_grad()});
  gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
            {random_tensor({3}, gen).set_requires_grad(),
             random_tensor({2, 3, 2}, gen).set_requires_grad()});

  const Tensor w = random_tensor({5, 4}, gen), bias = random_tensor({5}, gen);
  const Tensor x = random_tensor({2, 3, 4}, gen);
  const Tensor y = linear(x, w, bias);
  REQUIRE(y.shape() == Shape{2, 3, 5});
  CHECK(y.reshape({6, 5}).to_float_vector() ==
        linear(x.reshape({6, 4}), w, bias).to_float_vector());
  gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
            {random_tensor({2, 3, 4}, gen).set_requires_grad(),
             random_tensor({5, 4}, gen).set_requires_grad(),
             random_tensor({5}, gen).set_requires_grad()});
  CHECK(linear(random_tensor({4}, gen), w).shape() == Shape{5});
  CHECK_THROWS_WITH(matmul(random_tensor({2, 3, 4}, gen), random_tensor({2, 3, 4}, gen)),
                    Contains("inner dimensions differ"));
  CHECK_THROWS_WITH(matmul(random_tensor({2, 3, 4}, gen), random_tensor({3, 4, 2}, gen)),
                    Contains("cannot be broadcast"));
}

TEST_CASE("batch_norm on [N,C] and [N,C,L] (BatchNorm1d)", "[shape][batch_norm]") {
  Generator gen(3);
  for (const Shape& shape : std::vector<Shape>{{6, 3}, {4, 3, 5}}) {
    INFO("rank " << shape.size());
    gradcheck(
        [](const std::vector<Tensor>& in) {
          return batch_norm(in[0], in[1], in[2], {}, {}, true, 0.1, 1e-5);
        },
        {random_tensor(shape, gen).set_requires_grad(),
         random_tensor({3}, gen, 0.5, 1.5).set_requires_grad(),
         random_tensor({3}, gen).set_requires_grad()},
        {.eps = 1e-2, .atol = 5e-3, .rtol = 3e-2, .check_inputs = {}});
    // The statistics are those of the 4-D form.
    Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3});
    const Tensor x = random_tensor(shape, gen);
    batch_norm(x, {}, {}, rm, rv, true, 1.0, 1e-5);
    const Tensor per_channel = x.dim() == 2 ? x : x.transpose(1, 2).reshape({-1, 3});
    CHECK(rm.to_float_vector()[1] == Approx(mean(per_channel.select(1, 1)).item()).margin(1e-6));
  }
  CHECK_THROWS_WITH(batch_norm(Tensor::zeros({2}), {}, {}, {}, {}, true, 0.1, 1e-5),
                    Contains("expected [N,C], [N,C,L] or [N,C,H,W]"));
}
