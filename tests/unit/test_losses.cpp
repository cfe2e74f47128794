// nll_loss, cross_entropy with ignore_index, mse_loss and binary_cross_entropy_with_logits:
// values, the rows ignore_index leaves out, gradients against finite differences, errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using Catch::Matchers::Contains;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

namespace {
Tensor i64(const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}
}  // namespace

TEST_CASE("cross_entropy with ignore_index averages over the rows that count", "[loss]") {
  Generator gen(1);
  const Tensor logits = random_tensor({4, 5}, gen, -2, 2);
  const Tensor target = i64({1, -100, 3, 4});
  const double with_ignore = cross_entropy(logits, target, 0.0, -100).item();
  // The same as the fused loss over the three valid rows.
  const Tensor kept = index_select(logits, 0, i64({0, 2, 3}));
  CHECK(with_ignore == Approx(cross_entropy(kept, i64({1, 3, 4})).item()).epsilon(1e-6));
  CHECK(cross_entropy(logits, target, 0.1, -100).item() ==
        Approx(cross_entropy(kept, i64({1, 3, 4}), 0.1).item()).epsilon(1e-6));
  // Every row ignored: 0/0, as in PyTorch.
  CHECK(std::isnan(cross_entropy(logits, i64({7, 7, 7, 7}), 0.0, 7).item()));
  // nll_loss of log_softmax is cross_entropy.
  CHECK(nll_loss(log_softmax(logits, 1), target, -100).item() == Approx(with_ignore).epsilon(1e-6));
  CHECK(nll_loss(log_softmax(logits, 1), i64({0, 1, 2, 3}), std::nullopt, Reduction::sum).item() ==
        Approx(4 * cross_entropy(logits, i64({0, 1, 2, 3})).item()).epsilon(1e-6));
  gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], target, 0.2, -100); },
            {random_tensor({4, 5}, gen, -2, 2).set_requires_grad()});
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return nll_loss(in[0], i64({2, 0, 2}), 0, Reduction::none);
      },
      {random_tensor({3, 4}, gen, -3, 0).set_requires_grad()});
  CHECK_THROWS_WITH(nll_loss(logits, i64({1, 2})), Contains("target shape [2] does not match"));
  CHECK_THROWS_WITH(nll_loss(logits, i64({1, 2, 9, 0}), -100),
                    Contains("nll_loss: index 9") || Contains("gather: index 9"));
}

TEST_CASE("mse_loss and binary_cross_entropy_with_logits", "[loss]") {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  const Tensor b = Tensor::from_vector(std::vector<float>{1, 0, 5}, {3});
  CHECK(mse_loss(a, b).item() == Approx(8.0 / 3));
  CHECK(mse_loss(a, b, Reduction::sum).item() == Approx(8.0));
  CHECK(mse_loss(a, b, Reduction::none).to_float_vector() == std::vector<float>{0, 4, 4});
  // BCE against torch's values, including logits far out where a naive log(sigmoid) fails.
  const Tensor x = Tensor::from_vector(std::vector<float>{0.f, 2.f, -3.f, 100.f, -100.f}, {5});
  const Tensor y = Tensor::from_vector(std::vector<float>{1.f, 0.f, 0.25f, 0.f, 1.f}, {5});
  const std::vector<float> per =
      binary_cross_entropy_with_logits(x, y, Reduction::none).to_float_vector();
  const std::vector<float> want{0.69314718f, 2.12692809f, 0.79858732f, 100.f, 100.f};
  for (size_t i = 0; i < want.size(); ++i) CHECK(per[i] == Approx(want[i]).epsilon(1e-6));
  Generator gen(2);
  const Tensor t01 = random_tensor({3, 4}, gen, 0, 1);
  gradcheck(
      [&](const std::vector<Tensor>& in) { return binary_cross_entropy_with_logits(in[0], t01); },
      {random_tensor({3, 4}, gen, -4, 4).set_requires_grad()});
  gradcheck([](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1]); },
            {random_tensor({3, 4}, gen).set_requires_grad(),
             random_tensor({3, 4}, gen).set_requires_grad()});
  CHECK_THROWS_WITH(mse_loss(a, Tensor::zeros({2})), Contains("must have the same shape"));
}
