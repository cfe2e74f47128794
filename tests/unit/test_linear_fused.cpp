// linear_add (a linear layer with its residual connection as one op) against the separate ops
// it replaces, its gradients against finite differences, and the modules that use it:
// Sequential::forward_add and MultiheadAttention::forward_add.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "dpar/nn/activation.h"
#include "dpar/nn/transformer.h"
#include "gradcheck.h"

using namespace dpar;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto av = a.to_float_vector(), bv = b.to_float_vector();
  REQUIRE(av.size() == bv.size());
  double worst = 0;
  for (size_t i = 0; i < av.size(); ++i) worst = std::max(worst, std::abs(double(av[i]) - bv[i]));
  return worst;
}

// f(inputs) and the gradients of sum(w * f) for each input, on fresh leaves.
struct Run {
  Tensor out;
  std::vector<Tensor> grads;
};
Run run(const std::function<Tensor(const std::vector<Tensor>&)>& f,
        const std::vector<Tensor>& inputs, uint64_t seed = 5) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.defined() ? t.detach().set_requires_grad() : t);
  Run r;
  r.out = f(leaves);
  Generator gen(seed);
  sum(mul(r.out, random_tensor(r.out.shape(), gen))).backward();
  for (const Tensor& t : leaves) r.grads.push_back(t.defined() ? t.grad() : Tensor());
  return r;
}

// The fused run gives the separate run's output bitwise and its gradients to rounding.
void check_same(const Run& fused, const Run& separate) {
  CHECK(fused.out.to_float_vector() == separate.out.to_float_vector());
  REQUIRE(fused.grads.size() == separate.grads.size());
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    INFO("gradient of input " << i);
    if (!separate.grads[i].defined()) continue;
    REQUIRE(fused.grads[i].defined());
    CHECK(max_abs_diff(fused.grads[i], separate.grads[i]) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("linear_add equals linear plus the residual", "[linear][fused]") {
  Generator gen(42);
  // A tall input (the products with oneDNN's blocked weights), a small one (plain layout),
  // leading dims, and a transposed residual.
  for (const Shape& x_shape : {Shape{1100, 48}, Shape{5, 48}, Shape{2, 9, 48}}) {
    for (bool with_bias : {true, false}) {
      INFO("x " << shape_str(x_shape) << (with_bias ? " with" : " without") << " bias");
      const Tensor x = random_tensor(x_shape, gen);
      const Tensor w = random_tensor({64, 48}, gen);
      const Tensor b = with_bias ? random_tensor({64}, gen) : Tensor();
      Shape out_shape = x_shape;
      out_shape.back() = 64;
      const Tensor r = random_tensor(out_shape, gen);
      const Run fused =
          run([](auto& t) { return linear_add(t[0], t[1], t[2], t[3]); }, {x, w, b, r});
      const Run separate =
          run([](auto& t) { return add(linear(t[0], t[1], t[2]), t[3]); }, {x, w, b, r});
      check_same(fused, separate);
    }
  }
  // A residual that is a transposed view, and no input features at all (bias + residual).
  const Tensor x = random_tensor({6, 3}, gen), w = random_tensor({4, 3}, gen);
  const Tensor rt = random_tensor({4, 6}, gen).transpose(0, 1);
  check_same(run([](auto& t) { return linear_add(t[0], t[1], {}, t[2]); }, {x, w, rt}),
             run([](auto& t) { return add(linear(t[0], t[1]), t[2]); }, {x, w, rt}));
  const Tensor x0 = Tensor::zeros({3, 0}), w0 = Tensor::zeros({4, 0});
  const Tensor b0 = random_tensor({4}, gen), r0 = random_tensor({3, 4}, gen);
  CHECK(linear_add(x0, w0, b0, r0).to_float_vector() == add(r0, b0).to_float_vector());
}

TEST_CASE("linear_add takes a bf16 weight outside autocast as its f32 values", "[linear][fused]") {
  // The f32 kernel with the residual fused reads the weight cast to f32, not the bf16 buffer.
  Generator gen(44);
  const Tensor x = random_tensor({5, 48}, gen), b = random_tensor({64}, gen);
  const Tensor w16 = random_tensor({64, 48}, gen).to(DType::bf16);
  const Tensor r = random_tensor({5, 64}, gen);
  const Tensor w32 = w16.to(DType::f32);
  CHECK(linear_add(x, w16, b, r).to_float_vector() == linear_add(x, w32, b, r).to_float_vector());
  CHECK(linear(x, w16, b).to_float_vector() == linear(x, w32, b).to_float_vector());
}

TEST_CASE("linear_add gradients", "[linear][fused][gradcheck]") {
  Generator gen(43);
  Tensor x = random_tensor({6, 5}, gen).set_requires_grad();
  Tensor w = random_tensor({4, 5}, gen).set_requires_grad();
  Tensor b = random_tensor({4}, gen).set_requires_grad();
  Tensor r = random_tensor({6, 4}, gen).set_requires_grad();
  gradcheck([](auto& in) { return linear_add(in[0], in[1], in[2], in[3]); }, {x, w, b, r});
  gradcheck([](auto& in) { return linear_add(in[0], in[1], {}, in[2]); }, {x, w, r});
}

TEST_CASE("linear_add argument errors", "[linear][fused][errors]") {
  const Tensor x = Tensor::ones({2, 3}), w = Tensor::ones({4, 3});
  CHECK_THROWS_WITH(linear_add(x, w, {}, Tensor::ones({2, 5})),
                    Catch::Contains("linear_add: residual") &&
                        Catch::Contains("does not match the output [2,4]"));
  CHECK_THROWS_WITH(linear_add(Tensor::ones({2, 2, 3}), w, {}, Tensor::ones({2, 4})),
                    Catch::Contains("linear_add: residual [2,4] does not match the output"));
  CHECK_THROWS_WITH(linear_add(x, w, {}, Tensor()), Catch::Contains("residual is undefined"));
  CHECK_THROWS_WITH(linear_add(x, Tensor::ones({4, 2}), {}, Tensor::ones({2, 4})),
                    Catch::Contains("linear_add: input [2,3] has 3 features"));
}

TEST_CASE("Sequential::forward_add adds the residual in its last Linear", "[nn][fused]") {
  manual_seed(7);
  auto fc1 = std::make_shared<nn::Linear>(16, 32);
  auto act = std::make_shared<nn::GELU>();
  auto drop = std::make_shared<nn::Dropout>(0.0);
  auto fc2 = std::make_shared<nn::Linear>(32, 16);
  auto tail = std::make_shared<nn::Dropout>(0.0);
  nn::Sequential mlp({fc1, act, drop, fc2, tail});
  Generator gen(44);
  const Tensor x = random_tensor({3, 5, 16}, gen), r = random_tensor({3, 5, 16}, gen);
  auto one_by_one = [&](const Tensor& in) {
    return tail->forward(fc2->forward(drop->forward(act->forward(fc1->forward(in)))));
  };
  CHECK(mlp.forward(x).to_float_vector() == one_by_one(x).to_float_vector());
  CHECK(mlp.forward_add(x, r).to_float_vector() == add(one_by_one(x), r).to_float_vector());

  // The parameters' gradients through forward_add match the unfused chain's.
  auto grads_of = [&](const std::function<Tensor()>& f) {
    mlp.zero_grad(true);
    sum(mul(f(), r)).backward();
    std::vector<std::vector<float>> g;
    for (const Tensor& p : mlp.parameters()) g.push_back(p.grad().to_float_vector());
    return g;
  };
  const auto fused = grads_of([&] { return mlp.forward_add(x, r); });
  const auto separate = grads_of([&] { return add(one_by_one(x), r); });
  REQUIRE(fused.size() == separate.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    for (size_t j = 0; j < fused[i].size(); ++j) {
      CHECK(std::abs(fused[i][j] - separate[i][j]) <= 1e-5);
    }
  }

  // A trailing dropout that drops (training, p > 0) or a last child that is not a Linear:
  // forward + residual, unfused.
  nn::Sequential dropping(
      {std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::Dropout>(0.5)});
  dropping.eval();
  CHECK(dropping.forward_add(x, r).to_float_vector() ==
        add(dropping.forward(x), r).to_float_vector());
  dropping.train();
  const Tensor y = dropping.forward_add(x, r);
  CHECK(y.shape() == x.shape());
  nn::Sequential ends_in_gelu({std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::GELU>()});
  CHECK(ends_in_gelu.forward_add(x, r).to_float_vector() ==
        add(ends_in_gelu.forward(x), r).to_float_vector());
}

TEST_CASE("MultiheadAttention::forward_add is forward plus the residual", "[nn][fused]") {
  Generator gen(45);
  for (bool batch_first : {true, false}) {
    INFO("batch_first " << batch_first);
    manual_seed(8);
    nn::MultiheadAttention mha(24, 3, 0.0, true, batch_first);
    const Tensor x = random_tensor({4, 6, 24}, gen), r = random_tensor({4, 6, 24}, gen);
    const Tensor fused = mha.forward_add(x, r);
    const Tensor separate = add(mha.forward(x), r);
    CHECK(max_abs_diff(fused, separate) <= 1e-6);
    // The gradient reaching the residual is the output's.
    Tensor rl = r.detach().set_requires_grad();
    sum(mul(mha.forward_add(x, rl), r)).backward();
    CHECK(rl.grad().to_float_vector() == r.to_float_vector());
  }
  nn::MultiheadAttention mha(24, 3, 0.0, true, true);
  CHECK_THROWS_WITH(mha.forward_add(Tensor::ones({2, 3, 24}), Tensor::ones({2, 3, 12})),
                    Catch::Contains("MultiheadAttention::forward_add: residual [2,3,12] must "
                                    "have the input's shape [2,3,24]"));
}
