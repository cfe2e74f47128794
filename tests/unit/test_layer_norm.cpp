// layer_norm and group_norm: statistics, gradients against finite differences (with and
// without the affine parameters, strided inputs), determinism and errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using Catch::Matchers::Contains;
using dpar::testing::gradcheck;
using dpar::testing::GradcheckOptions;
using dpar::testing::random_tensor;

TEST_CASE("layer_norm normalises each row over the last dims", "[layer_norm]") {
  Generator gen(1);
  const Tensor x = random_tensor({3, 4, 6}, gen, -2, 3);
  const Tensor y = layer_norm(x, {6});
  REQUIRE(y.shape() == x.shape());
  const std::vector<float> v = y.to_float_vector();
  for (int r = 0; r < 12; ++r) {
    double s = 0, s2 = 0;
    for (int j = 0; j < 6; ++j) {
      s += v[static_cast<size_t>(r * 6 + j)];
      s2 += v[static_cast<size_t>(r * 6 + j)] * v[static_cast<size_t>(r * 6 + j)];
    }
    CHECK(s / 6 == Approx(0).margin(1e-6));
    CHECK(s2 / 6 == Approx(1).epsilon(1e-4));  // biased variance 1 (eps 1e-5 aside)
  }
  // Over the last two dims = over one flattened row of 24.
  CHECK(layer_norm(x, {4, 6}).reshape({3, 24}).to_float_vector() ==
        layer_norm(x.reshape({3, 24}), {24}).to_float_vector());
  const Tensor w = random_tensor({6}, gen), b = random_tensor({6}, gen);
  const Tensor yw = layer_norm(x, {6}, w, b);
  // The affine step fused into the normalisation (an FMA where the CPU has one).
  CHECK(dpar::testing::max_rel_error(yw.to_float_vector(), add(mul(y, w), b).to_float_vector()) <
        1e-5);
}

TEST_CASE("layer_norm under a residual connection adds its input gradient into the other one",
          "[layer_norm]") {
  // A pre-norm block, x + linear(layer_norm(x)), twice: each layer norm's backward finds the
  // residual's gradient already delivered and adds into it. The result must be the same bits as
  // the two gradients added after the fact.
  Generator gen(5);
  const Tensor w1 = random_tensor({48, 48}, gen, -0.2, 0.2), b1 = random_tensor({48}, gen);
  const Tensor lw = random_tensor({48}, gen), lb = random_tensor({48}, gen);
  const Tensor r = random_tensor({4, 7, 48}, gen);
  const Tensor x0 = random_tensor({4, 7, 48}, gen, -2, 2);
  auto block = [&](const Tensor& in) {
    return linear_add(layer_norm(in, {48}, lw, lb), w1, b1, in);
  };
  Tensor x = x0.detach().set_requires_grad();
  Tensor h = block(x);
  sum(mul(block(h), r)).backward();

  // The same gradient by hand: through each block, the residual's gradient plus the layer
  // norm branch's alone (a separate backward, where nothing is there to add into).
  auto through = [&](const Tensor& in, const Tensor& g) {
    Tensor leaf = in.detach().set_requires_grad();
    sum(mul(linear(layer_norm(leaf, {48}, lw, lb), w1, b1), g)).backward();
    return add(g, leaf.grad());
  };
  const Tensor g_h = through(h, r);
  const Tensor g_x = through(x0, g_h);
  CHECK(x.grad().to_float_vector() == g_x.to_float_vector());
}

TEST_CASE("layer_norm and group_norm gradients match finite differences",
          "[layer_norm][gradcheck]") {
  Generator gen(2);
  const GradcheckOptions opt{.eps = 1e-2, .atol = 3e-3, .rtol = 3e-2, .check_inputs = {}};
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], {5}, in[1], in[2]); },
            {random_tensor({2, 3, 5}, gen, -2, 2).set_requires_grad(),
             random_tensor({5}, gen, 0.5, 1.5).set_requires_grad(),
             random_tensor({5}, gen).set_requires_grad()},
            opt);
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {3, 4});
      },
      {random_tensor({2, 3, 4}, gen, -2, 2).set_requires_grad()}, opt);
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], {4}, in[1]); },
            {random_tensor({3, 4}, gen, -2, 2).set_requires_grad(),
             random_tensor({4}, gen, 0.5, 1.5).set_requires_grad()},
            opt);
  // A transposed (non-contiguous) input.
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0].transpose(0, 1), {3}); },
            {random_tensor({3, 4}, gen, -2, 2).set_requires_grad()}, opt);
  gradcheck([](const std::vector<Tensor>& in) { return group_norm(in[0], 2, in[1], in[2]); },
            {random_tensor({2, 4, 3, 2}, gen, -2, 2).set_requires_grad(),
             random_tensor({4}, gen, 0.5, 1.5).set_requires_grad(),
             random_tensor({4}, gen).set_requires_grad()},
            opt);
  gradcheck([](const std::vector<Tensor>& in) { return group_norm(in[0], 3); },
            {random_tensor({2, 6, 4}, gen, -2, 2).set_requires_grad()}, opt);
}

TEST_CASE("group_norm equals layer_norm per (sample, group); errors name the shapes",
          "[layer_norm]") {
  Generator gen(3);
  const Tensor x = random_tensor({2, 6, 3, 3}, gen, -1, 2, MemoryFormat::ChannelsLast);
  const Tensor y = group_norm(x, 3);
  const Tensor ref = layer_norm(x.contiguous().view({2, 3, 18}), {18}).view({2, 6, 3, 3});
  CHECK(y.to_float_vector() == ref.to_float_vector());
  // A large input runs the threaded path; same bits as a second run (deterministic sums).
  Tensor big = random_tensor({64, 768}, gen).set_requires_grad();
  Tensor w = Tensor::ones({768}).set_requires_grad();
  sum(mul(layer_norm(big, {768}, w), 1.5)).backward();
  const std::vector<float> first = w.grad().to_float_vector();
  w.set_grad({});
  sum(mul(layer_norm(big, {768}, w), 1.5)).backward();
  CHECK(w.grad().to_float_vector() == first);

  CHECK_THROWS_WITH(layer_norm(x, {4}), Contains("does not match the last dims"));
  CHECK_THROWS_WITH(layer_norm(x, {3}, Tensor::ones({4})), Contains("weight has shape [4]"));
  CHECK_THROWS_WITH(group_norm(x, 4), Contains("6 channels cannot be split into 4 groups"));
}
