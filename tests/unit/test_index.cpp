// Comparisons, where / masked_fill, gather, index_select, embedding and max/min: values
// against hand-computed results, gradients against finite differences, and argument errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using Catch::Matchers::Contains;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

namespace {

Tensor i64(const std::vector<int64_t>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}
Tensor f32(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}

std::vector<int64_t> ints(const Tensor& t) { return t.to(DType::i64).to_int_vector(); }

}  // namespace

TEST_CASE("comparisons broadcast and return 0/1 u8 tensors; NaN is unequal", "[index]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = f32({1.f, 2.f, 3.f, nan}, {4});
  const Tensor b = f32({2.f}, {1});
  CHECK(eq(a, b).dtype() == DType::u8);
  CHECK(ints(eq(a, b)) == std::vector<int64_t>{0, 1, 0, 0});
  CHECK(ints(ne(a, b)) == std::vector<int64_t>{1, 0, 1, 1});
  CHECK(ints(lt(a, b)) == std::vector<int64_t>{1, 0, 0, 0});
  CHECK(ints(le(a, 2.0)) == std::vector<int64_t>{1, 1, 0, 0});
  CHECK(ints(gt(a, 2.0)) == std::vector<int64_t>{0, 0, 1, 0});
  CHECK(ints(ge(a, b)) == std::vector<int64_t>{0, 1, 1, 0});
  // [2,1] against [3]: a [2,3] table.
  const Tensor col = f32({1.f, 3.f}, {2, 1});
  const Tensor row = f32({0.f, 2.f, 3.f}, {3});
  CHECK(lt(col, row).shape() == Shape{2, 3});
  CHECK(ints(lt(col, row)) == std::vector<int64_t>{0, 1, 1, 0, 0, 0});
  CHECK_THROWS_WITH(lt(Tensor::zeros({2}), Tensor::zeros({3})), Contains("cannot be broadcast"));
}

TEST_CASE("where and masked_fill pick elementwise; gradients go to the chosen side", "[index]") {
  const Tensor cond = gt(f32({1.f, -1.f, 2.f, -2.f}, {2, 2}), 0.0);
  Tensor a = f32({10.f, 20.f, 30.f, 40.f}, {2, 2});
  Tensor b = f32({-5.f}, {1});
  CHECK(where(cond, a, b).to_float_vector() == std::vector<float>{10, -5, 30, -5});
  CHECK(where(cond, a, 7.0).to_float_vector() == std::vector<float>{10, 7, 30, 7});
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(masked_fill(a, cond, -inf).to_float_vector() == std::vector<float>{-inf, 20, -inf, 40});
  // Infinite values on the side not chosen do not leak in (a product form would give NaN).
  const Tensor infs = Tensor::full({2, 2}, inf);
  CHECK(where(cond, a, infs).to_float_vector() == std::vector<float>{10, inf, 30, inf});

  Generator gen(3);
  const Tensor mask = gt(random_tensor({3, 4}, gen), 0.0);
  gradcheck([&](const std::vector<Tensor>& in) { return where(mask, in[0], in[1]); },
            {random_tensor({3, 4}, gen).set_requires_grad(),
             random_tensor({4}, gen).set_requires_grad()});
  gradcheck([&](const std::vector<Tensor>& in) { return masked_fill(in[0], mask, 0.5); },
            {random_tensor({3, 4}, gen).set_requires_grad()});
  CHECK_THROWS_WITH(where(Tensor::zeros({2}), a, b), Contains("condition must be a u8 tensor"));
}

TEST_CASE("gather and index_select follow torch; repeated indices accumulate gradients",
          "[index]") {
  const Tensor x = f32({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  CHECK(gather(x, 1, i64({2, 0, 1, 1}, {2, 2})).to_float_vector() ==
        std::vector<float>{3, 1, 5, 5});
  CHECK(gather(x, 0, i64({1, 0, 1}, {1, 3})).to_float_vector() == std::vector<float>{4, 2, 6});
  CHECK(index_select(x, 1, i64({2, 2, 0}, {3})).to_float_vector() ==
        std::vector<float>{3, 3, 1, 6, 6, 4});
  CHECK(index_select(x, 0, i64({1}, {1})).shape() == Shape{1, 3});

  Generator gen(4);
  const Tensor index = i64({0, 2, 2, 1, 0, 0, 3, 3}, {2, 4});
  gradcheck([&](const std::vector<Tensor>& in) { return gather(in[0], 1, index); },
            {random_tensor({2, 4}, gen).set_requires_grad()});
  const Tensor rows = i64({1, 1, 0, 2}, {4});
  gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], 0, rows); },
            {random_tensor({3, 5}, gen).set_requires_grad()});
  // A non-contiguous input (a transposed view).
  gradcheck(
      [&](const std::vector<Tensor>& in) { return index_select(in[0].transpose(0, 1), 1, rows); },
      {random_tensor({3, 5}, gen).set_requires_grad()});
  // The gradient of a row selected twice is twice the upstream gradient.
  Tensor w = Tensor::ones({3, 2}).set_requires_grad();
  sum(index_select(w, 0, i64({2, 2, 0}, {3}))).backward();
  CHECK(w.grad().to_float_vector() == std::vector<float>{1, 1, 0, 0, 2, 2});

  CHECK_THROWS_WITH(gather(x, 1, i64({3}, {1, 1})), Contains("gather: index 3 is outside [0, 3)"));
  CHECK_THROWS_WITH(index_select(x, 0, i64({-1}, {1})),
                    Contains("index_select: index -1 is outside [0, 2)"));
  CHECK_THROWS_WITH(index_select(x, 0, x), Contains("the index must be i64"));
  CHECK_THROWS_WITH(gather(x, 1, i64({0}, {1})), Contains("same number of dims"));
}

TEST_CASE("embedding looks rows up; the padding row learns nothing", "[index]") {
  Generator gen(5);
  Tensor weight = random_tensor({6, 3}, gen).set_requires_grad();
  const Tensor ids = i64({5, 0, 2, 2, 1, 0}, {2, 3});
  const Tensor out = embedding(weight, ids);
  REQUIRE(out.shape() == Shape{2, 3, 3});
  const std::vector<float> w = weight.to_float_vector(), o = out.to_float_vector();
  for (int k = 0; k < 3; ++k) CHECK(o[static_cast<size_t>(k)] == w[static_cast<size_t>(15 + k)]);
  gradcheck([&](const std::vector<Tensor>& in) { return embedding(in[0], ids); },
            {random_tensor({6, 3}, gen).set_requires_grad()});
  sum(embedding(weight, ids, 2)).backward();
  const std::vector<float> g = weight.grad().to_float_vector();
  CHECK(g[6] == 0.f);   // row 2: padding
  CHECK(g[0] == 2.f);   // row 0 appears twice
  CHECK(g[15] == 1.f);  // row 5 once
  weight.set_grad({});
  sum(embedding(weight, ids, -4)).backward();  // -4 is row 2 as well
  CHECK(weight.grad().to_float_vector()[6] == 0.f);
  CHECK_THROWS_WITH(embedding(weight, i64({6}, {1})), Contains("embedding: index 6 is outside"));
  CHECK_THROWS_WITH(embedding(weight, ids, 6), Contains("padding_idx 6 is outside [-6, 6)"));
}

TEST_CASE("max and min over a dim give values, first indices and a routed gradient", "[index]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = f32({1.f, 5.f, 5.f, -2.f, 0.f, 7.f}, {2, 3});
  MaxResult m = max(x, 1);
  CHECK(m.values.to_float_vector() == std::vector<float>{5, 7});
  CHECK(m.indices.to_int_vector() == std::vector<int64_t>{1, 2});  // first of the two 5s
  MaxResult n = min(x, 0, /*keepdim=*/true);
  CHECK(n.values.shape() == Shape{1, 3});
  CHECK(n.values.to_float_vector() == std::vector<float>{-2, 0, 5});
  CHECK(max(x).item() == 7.0);
  CHECK(min(x).item() == -2.0);
  CHECK(std::isnan(max(f32({1.f, nan, 3.f}, {3})).item()));
  CHECK(max(x, -1).values.to_float_vector() == std::vector<float>{5, 7});

  for (int dim : {0, 1, 2}) {
    gradcheck([&](const std::vector<Tensor>& in) { return max(in[0], dim).values; },
              {dpar::testing::distinct_values({3, 4, 5}, 10 + dim).set_requires_grad()});
    gradcheck([&](const std::vector<Tensor>& in) { return min(in[0], dim, true).values; },
              {dpar::testing::distinct_values({3, 4, 5}, 20 + dim).set_requires_grad()});
  }
  gradcheck([&](const std::vector<Tensor>& in) { return max(in[0]); },
            {dpar::testing::distinct_values({4, 5}, 30).set_requires_grad()});
  CHECK_THROWS_WITH(max(x, 2), Contains("dimension 2 out of range"));
}
