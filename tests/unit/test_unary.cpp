// Pointwise unary ops, activations and dropout: values, gradients (at and away from kinks),
// layouts, determinism and argument errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

namespace {

using UnaryFn = std::function<Tensor(const Tensor&)>;

// Values drawn from [lo, hi) but never within `margin` of any kink, so that central
// differences with step 1e-2 never straddle one.
Tensor tensor_off_kinks(const Shape& shape, Generator& gen, float lo, float hi,
                        const std::vector<float>& kinks, float margin,
                        MemoryFormat format = MemoryFormat::Contiguous) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) {
    bool near = true;
    while (near) {
      x = lo + (hi - lo) * gen.uniform();
      near = false;
      for (float k : kinks) near = near || std::abs(x - k) < margin;
    }
  }
  Tensor t = Tensor::empty(shape, DType::f32, Device::cpu(), format);
  t.copy_(Tensor::from_vector(v, shape));
  return t;
}

std::vector<float> eval_at(const UnaryFn& f, const std::vector<float>& x) {
  return f(Tensor::from_vector(x, {static_cast<int64_t>(x.size())})).to_float_vector();
}

// d f / dx at each point, through autograd.
std::vector<float> grad_at(const UnaryFn& f, const std::vector<float>& x) {
  Tensor t = Tensor::from_vector(x, {static_cast<int64_t>(x.size())}).set_requires_grad();
  sum(f(t)).backward();
  return t.grad().to_float_vector();
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, double tol = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(double(want[i]))));
  }
}

}  // namespace

TEST_CASE("unary values", "[unary]") {
  const std::vector<float> pts{-4, -1, 0, 2, 4};
  check_close(eval_at([](const Tensor& t) { return hardswish(t); }, pts),
              {0.f, -1.f / 3.f, 0.f, 5.f / 3.f, 4.f});
  check_close(eval_at([](const Tensor& t) { return hardsigmoid(t); }, pts),
              {0.f, 1.f / 3.f, 0.5f, 5.f / 6.f, 1.f});
  check_close(eval_at([](const Tensor& t) { return relu(t); }, pts), {0, 0, 0, 2, 4});
  check_close(eval_at([](const Tensor& t) { return sigmoid(t); }, {0.f, 2.f, -2.f}),
              {0.5f, 0.880797078f, 0.119202922f});
  check_close(eval_at([](const Tensor& t) { return exp(t); }, {0.f, 1.f, -2.f}),
              {1.f, 2.718281828f, 0.135335283f});
  check_close(eval_at([](const Tensor& t) { return log(t); }, {1.f, 2.718281828f, 0.5f}),
              {0.f, 1.f, -0.693147181f});
  check_close(eval_at([](const Tensor& t) { return sqrt(t); }, {4.f, 2.f, 0.f}),
              {2.f, 1.414213562f, 0.f});
  check_close(eval_at([](const Tensor& t) { return square(t); }, {-3.f, 0.5f}), {9.f, 0.25f});
  // NaN propagates through the piecewise activations and through fast_exp (whose 2^n scale
  // once converted a NaN to int: undefined behaviour that UBSan stops on, a fuzz finding).
  for (const UnaryFn& f : std::vector<UnaryFn>{
           [](const Tensor& t) { return relu(t); }, [](const Tensor& t) { return hardswish(t); },
           [](const Tensor& t) { return hardsigmoid(t); },
           [](const Tensor& t) { return sigmoid(t); }, [](const Tensor& t) { return exp(t); }}) {
    CHECK(std::isnan(eval_at(f, {std::nanf("")})[0]));
  }
}

TEST_CASE("the activations and pointwise maths of a second model", "[unary]") {
  const std::vector<float> pts{-2, -0.5, 0, 1, 3};
  check_close(eval_at([](const Tensor& t) { return dpar::tanh(t); }, pts),
              {-0.96402758f, -0.46211716f, 0.f, 0.76159416f, 0.99505475f});
  // Reference values from torch 1.13 (F.gelu, F.gelu(approximate="tanh"), F.silu, F.softplus).
  check_close(eval_at([](const Tensor& t) { return gelu(t); }, pts),
              {-0.04550010f, -0.15426879f, 0.f, 0.84134471f, 2.99595022f});
  check_close(eval_at([](const Tensor& t) { return gelu(t, GeluApproximation::tanh); }, pts),
              {-0.04540229f, -0.15428600f, 0.f, 0.84119201f, 2.99636269f});
  check_close(eval_at([](const Tensor& t) { return silu(t); }, pts),
              {-0.23840584f, -0.18877034f, 0.f, 0.73105860f, 2.85772252f});
  check_close(eval_at([](const Tensor& t) { return softplus(t); }, pts),
              {0.12692800f, 0.47407699f, 0.69314718f, 1.31326163f, 3.04858732f});
  check_close(eval_at([](const Tensor& t) { return softplus(t, 1.0, 2.0); }, pts),
              {0.12692800f, 0.47407699f, 0.69314718f, 1.31326163f, 3.f});
  check_close(eval_at([](const Tensor& t) { return leaky_relu(t); }, pts),
              {-0.02f, -0.005f, 0.f, 1.f, 3.f});
  check_close(eval_at([](const Tensor& t) { return dpar::abs(t); }, pts), {2, 0.5, 0, 1, 3});
  check_close(eval_at([](const Tensor& t) { return clamp(t, -1.0, 2.0); }, pts),
              {-1, -0.5, 0, 1, 2});
  check_close(eval_at([](const Tensor& t) { return clamp(t, std::nullopt, 0.5); }, pts),
              {-2, -0.5, 0, 0.5, 0.5});
  check_close(eval_at([](const Tensor& t) { return dpar::pow(t, 2.0); }, pts), {4, 0.25, 0, 1, 9});
  check_close(eval_at([](const Tensor& t) { return dpar::erf(t); }, pts),
              {-0.99532227f, -0.52049988f, 0.f, 0.84270079f, 0.99997791f}, 2e-7);
  // Gradients where the formulas have kinks or special cases, as PyTorch defines them.
  check_close(grad_at([](const Tensor& t) { return dpar::abs(t); }, {-1.f, 0.f, 2.f}), {-1, 0, 1});
  check_close(grad_at([](const Tensor& t) { return clamp(t, -1.0, 2.0); }, {-1.f, 0.f, 2.f, 3.f}),
              {1, 1, 1, 0});
  check_close(grad_at([](const Tensor& t) { return leaky_relu(t, 0.1); }, {-1.f, 0.f, 1.f}),
              {0.1f, 0.1f, 1.f});
  check_close(grad_at([](const Tensor& t) { return dpar::pow(t, 0.0); }, {0.f, 2.f}), {0, 0});
  CHECK_THROWS_WITH(clamp(Tensor::zeros({2}), std::nullopt), Catch::Contains("at least one"));
  CHECK_THROWS_WITH(softplus(Tensor::zeros({2}), 0.0), Catch::Contains("beta must be positive"));
}

TEST_CASE("activation gradients at the kinks follow PyTorch", "[unary]") {
  const std::vector<float> pts{-4, -3, -1, 0, 3, 4};
  // relu: gradient 0 at 0
  check_close(grad_at([](const Tensor& t) { return relu(t); }, pts), {0, 0, 0, 0, 1, 1});
  // hardswish: 0 below -3, x/3 + 1/2 on [-3, 3], 1 above
  check_close(grad_at([](const Tensor& t) { return hardswish(t); }, pts),
              {0.f, -0.5f, 1.f / 6.f, 0.5f, 1.5f, 1.f});
  // hardsigmoid: 1/6 strictly inside (-3, 3), 0 elsewhere
  check_close(grad_at([](const Tensor& t) { return hardsigmoid(t); }, pts),
              {0.f, 0.f, 1.f / 6.f, 1.f / 6.f, 0.f, 0.f});
  check_close(grad_at([](const Tensor& t) { return sigmoid(t); }, {0.f}), {0.25f});
}

TEST_CASE("unary gradients match finite differences", "[unary][gradcheck]") {
  struct Case {
    const char* name;
    UnaryFn f;
    float lo, hi;
    std::vector<float> kinks;
  };
  const std::vector<Case> cases{
      {"exp", [](const Tensor& t) { return exp(t); }, -2, 2, {}},
      {"log", [](const Tensor& t) { return log(t); }, 0.5, 3, {}},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }, 0.5, 3, {}},
      {"square", [](const Tensor& t) { return square(t); }, -2, 2, {}},
      {"relu", [](const Tensor& t) { return relu(t); }, -2, 2, {0}},
      {"hardswish", [](const Tensor& t) { return hardswish(t); }, -5, 5, {-3, 3}},
      {"hardsigmoid", [](const Tensor& t) { return hardsigmoid(t); }, -5, 5, {-3, 3}},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }, -4, 4, {}},
      {"tanh", [](const Tensor& t) { return dpar::tanh(t); }, -3, 3, {}},
      {"gelu", [](const Tensor& t) { return gelu(t); }, -4, 4, {}},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, GeluApproximation::tanh); }, -4, 4, {}},
      {"silu", [](const Tensor& t) { return silu(t); }, -5, 5, {}},
      {"softplus", [](const Tensor& t) { return softplus(t); }, -5, 5, {}},
      // beta 2, threshold 3: the linear piece above x = 1.5 (continuous up to rounding)
      {"softplus_b2", [](const Tensor& t) { return softplus(t, 2.0, 3.0); }, -3, 3, {1.5}},
      {"leaky_relu", [](const Tensor& t) { return leaky_relu(t, 0.2); }, -2, 2, {0}},
      {"abs", [](const Tensor& t) { return dpar::abs(t); }, -2, 2, {0}},
      {"clamp", [](const Tensor& t) { return clamp(t, -0.5, 0.7); }, -2, 2, {-0.5, 0.7}},
      {"clamp_min", [](const Tensor& t) { return clamp(t, 0.1); }, -2, 2, {0.1}},
      {"pow", [](const Tensor& t) { return dpar::pow(t, 3.0); }, -2, 2, {}},
      {"pow_frac", [](const Tensor& t) { return dpar::pow(t, 0.5); }, 0.5, 3, {}},
      {"erf", [](const Tensor& t) { return dpar::erf(t); }, -3, 3, {}},
  };
  Generator gen(11);
  for (const Case& c : cases) {
    INFO(c.name);
    auto f = [&](const std::vector<Tensor>& in) { return c.f(in[0]); };
    for (const Shape& shape : std::vector<Shape>{{7}, {3, 4}}) {
      Tensor x = tensor_off_kinks(shape, gen, c.lo, c.hi, c.kinks, 0.05f).set_requires_grad();
      gradcheck(f, {x});
    }
    Tensor cl =
        tensor_off_kinks({2, 3, 2, 3}, gen, c.lo, c.hi, c.kinks, 0.05f, MemoryFormat::ChannelsLast)
            .set_requires_grad();
    gradcheck(f, {cl});
    // A non-dense input (strided view) takes the general path.
    Tensor base = tensor_off_kinks({4, 6}, gen, c.lo, c.hi, c.kinks, 0.05f).set_requires_grad();
    gradcheck([&](const std::vector<Tensor>& in) { return c.f(in[0].slice(1, 0, 6, 2)); }, {base});
  }
}

TEST_CASE("activations keep the input layout", "[unary]") {
  Generator gen(12);
  Tensor x = random_tensor({2, 5, 3, 4}, gen, -5, 5, MemoryFormat::ChannelsLast);
  Tensor xc = x.contiguous();
  for (const UnaryFn& f : std::vector<UnaryFn>{[](const Tensor& t) { return relu(t); },
                                               [](const Tensor& t) { return hardswish(t); },
                                               [](const Tensor& t) { return sigmoid(t); }}) {
    Tensor y = f(x);
    CHECK(y.is_contiguous(MemoryFormat::ChannelsLast));
    CHECK(y.to_float_vector() == f(xc).to_float_vector());
  }
  // A strided view gives a contiguous result with the same values as a dense copy.
  Tensor v = x.slice(3, 1, 4, 2);
  Tensor y = hardswish(v);
  CHECK(y.is_contiguous());
  CHECK(y.to_float_vector() == hardswish(v.contiguous()).to_float_vector());
}

TEST_CASE("large tensors: parallel flat path equals the strided path", "[unary]") {
  Generator gen(13);
  Tensor x = random_tensor({400, 300}, gen, -5, 5).set_requires_grad();  // > 64K elements
  Tensor xt = x.detach().transpose(0, 1).contiguous().transpose(0, 1);   // column-major copy
  for (const UnaryFn& f : std::vector<UnaryFn>{[](const Tensor& t) { return hardswish(t); },
                                               [](const Tensor& t) { return sigmoid(t); }}) {
    CHECK(f(x).to_float_vector() == f(xt).to_float_vector());
  }
  Tensor y = hardswish(x);
  sum(y).backward();
  const std::vector<float> g = x.grad().to_float_vector(), xv = x.to_float_vector();
  for (size_t i = 0; i < xv.size(); i += 997) {
    const float want = xv[i] < -3.f ? 0.f : (xv[i] <= 3.f ? xv[i] / 3.f + 0.5f : 1.f);
    CHECK(g[i] == want);
  }
}

TEST_CASE("a training activation past 4 MiB (streaming stores) has the same bits", "[unary]") {
  // 1025 x 1025 floats: larger than the size from which a training forward streams its output,
  // and one more than a whole number of the 64-float blocks it streams, so the tail runs too.
  Generator gen(17);
  Tensor x = random_tensor({1025, 1025}, gen, -6, 6);
  Tensor trained = x.detach().set_requires_grad();
  for (const UnaryFn& f : std::vector<UnaryFn>{[](const Tensor& t) { return gelu(t); },
                                               [](const Tensor& t) { return silu(t); }}) {
    Tensor streamed = f(trained);  // needs grad: the output is streamed where the CPU can
    Tensor plain = f(x);           // no grad: plain stores
    CHECK(streamed.to_float_vector() == plain.to_float_vector());
  }
}

TEST_CASE("dropout", "[unary][dropout]") {
  const double p = 0.3;
  Tensor x = Tensor::full({1000, 1000}, 2.0);
  SECTION("deterministic for a seed") {
    Generator g1(42), g2(42), g3(43);
    const auto a = dropout(x, p, true, g1).to_float_vector();
    CHECK(a == dropout(x, p, true, g2).to_float_vector());
    CHECK(a != dropout(x, p, true, g3).to_float_vector());
  }
  SECTION("drops about p and scales survivors by 1/(1-p)") {
    Generator gen(1);
    const auto y = dropout(x, p, true, gen).to_float_vector();
    const float kept = static_cast<float>(2.0 * (1.0 / (1.0 - p)));
    size_t zeros = 0;
    for (float v : y) {
      if (v == 0.f) {
        ++zeros;
      } else {
        CHECK(v == kept);
      }
    }
    CHECK(std::abs(static_cast<double>(zeros) / static_cast<double>(y.size()) - p) < 0.003);
  }
  SECTION("identity in eval mode and for p = 0") {
    Generator gen(1);
    Tensor y = dropout(x, p, false, gen);
    CHECK(y.to_float_vector() == x.to_float_vector());
    CHECK(dropout(x, 0.0, true, gen).to_float_vector() == x.to_float_vector());
  }
  SECTION("backward uses the same mask") {
    Generator gen(5);
    Tensor w = random_tensor({50, 40}, gen, 0.5, 1.5).set_requires_grad();
    Tensor y = dropout(w, 0.5, true, gen);
    sum(y).backward();
    const auto yv = y.to_float_vector(), wv = w.to_float_vector(), g = w.grad().to_float_vector();
    for (size_t i = 0; i < yv.size(); ++i) {
      if (yv[i] == 0.f) {
        CHECK(g[i] == 0.f);
      } else {
        CHECK(g[i] == 2.f);
        CHECK(yv[i] == wv[i] * 2.f);
      }
    }
  }
  SECTION("the mask does not depend on the layout") {
    Generator g0(3);
    Tensor cl = random_tensor({2, 3, 4, 5}, g0, -1, 1, MemoryFormat::ChannelsLast);
    Generator g1(9), g2(9);
    Tensor a = dropout(cl, 0.5, true, g1);
    CHECK(a.is_contiguous(MemoryFormat::ChannelsLast));
    CHECK(a.to_float_vector() == dropout(cl.contiguous(), 0.5, true, g2).to_float_vector());
  }
  SECTION("p outside [0, 1) is an error") {
    CHECK_THROWS_WITH(dropout(x, 1.0, true), Catch::Contains("dropout: probability p"));
    CHECK_THROWS_WITH(dropout(x, -0.1, true), Catch::Contains("got -0.1"));
    CHECK_THROWS_WITH(dropout(x, 1.5, false), Catch::Contains("dropout"));
  }
}

TEST_CASE("unary argument errors name the op", "[unary][errors]") {
  Tensor i = Tensor::ones({2, 3}, DType::i64);
  CHECK_THROWS_WITH(relu(i), Catch::Contains("relu: expects an f32 tensor"));
  CHECK_THROWS_WITH(hardswish(i), Catch::Contains("hardswish: expects an f32 tensor"));
  CHECK_THROWS_WITH(exp(Tensor()), Catch::Contains("exp: input is undefined"));
  CHECK_THROWS_WITH(dropout(i, 0.5, true), Catch::Contains("dropout: expects an f32 tensor"));
}
