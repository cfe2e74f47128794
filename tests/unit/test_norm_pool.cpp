#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "gradcheck.h"
#include "tensor/nn_kernels.h"

using namespace dpar;
using dpar::testing::gradcheck;
using dpar::testing::max_rel_error;
using dpar::testing::random_tensor;

namespace {

// Per-channel mean and biased variance of x (logical NCHW values), in double.
void channel_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  const std::vector<float> v = x.to_float_vector();
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  mean.assign(C, 0.0);
  var.assign(C, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) mean[c] += v[(n * C + c) * HW + p];
  for (auto& m : mean) m /= static_cast<double>(N * HW);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) {
        const double d = v[(n * C + c) * HW + p] - mean[c];
        var[c] += d * d;
      }
  for (auto& s : var) s /= static_cast<double>(N * HW);
}

// y = (x - mean) / sqrt(var + eps) * w + b in logical NCHW order.
std::vector<float> normalize(const Tensor& x, const std::vector<double>& mean,
                             const std::vector<double>& var, const Tensor& w, const Tensor& b,
                             double eps) {
  const std::vector<float> v = x.to_float_vector();
  const std::vector<float> wv = w.defined() ? w.to_float_vector() : std::vector<float>();
  const std::vector<float> bv = b.defined() ? b.to_float_vector() : std::vector<float>();
  const int64_t C = x.size(1), HW = x.size(2) * x.size(3);
  std::vector<float> y(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t c = (static_cast<int64_t>(i) / HW) % C;
    double r = (v[i] - mean[c]) / std::sqrt(var[c] + eps);
    if (!wv.empty()) r *= wv[c];
    if (!bv.empty()) r += bv[c];
    y[i] = static_cast<float>(r);
  }
  return y;
}

std::vector<double> to_double(const Tensor& t) {
  const std::vector<float> v = t.to_float_vector();
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("batch_norm training: batch statistics and PyTorch running-stat update", "[norm]") {
  Generator gen(31);
  const double momentum = 0.1, eps = 1e-3;
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    Tensor x = random_tensor({3, 4, 3, 2}, gen, -2, 2, format);
    Tensor w = random_tensor({4}, gen, 0.5f, 1.5f);
    Tensor b = random_tensor({4}, gen);
    Tensor rm = random_tensor({4}, gen);
    Tensor rv = random_tensor({4}, gen, 0.5f, 2.f);
    const std::vector<float> rm0 = rm.to_float_vector(), rv0 = rv.to_float_vector();

    const Tensor y = batch_norm(x, w, b, rm, rv, /*training=*/true, momentum, eps);
    CHECK(y.strides() == x.strides());  // keeps the input's layout

    std::vector<double> mean, var;
    channel_stats(x, mean, var);
    CHECK(max_rel_error(y.to_float_vector(), normalize(x, mean, var, w, b, eps), 0.1) < 1e-4);
    const double n = 3 * 3 * 2;
    std::vector<float> expect_rm(4), expect_rv(4);
    for (int c = 0; c < 4; ++c) {
      expect_rm[c] = static_cast<float>((1 - momentum) * rm0[c] + momentum * mean[c]);
      expect_rv[c] = static_cast<float>((1 - momentum) * rv0[c] + momentum * var[c] * n / (n - 1));
    }
    CHECK(max_rel_error(rm.to_float_vector(), expect_rm) < 1e-5);
    CHECK(max_rel_error(rv.to_float_vector(), expect_rv) < 1e-5);
  }
}

TEST_CASE("batch_norm training gradients", "[norm]") {
  Generator gen(32);
  dpar::testing::GradcheckOptions opt;
  opt.eps = 1e-3;  // batch statistics make the map curved; a smaller step keeps truncation low
  opt.atol = 5e-3;
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    Tensor x = random_tensor({3, 3, 2, 3}, gen, -2, 2, format).set_requires_grad();
    Tensor w = random_tensor({3}, gen, 0.5f, 1.5f).set_requires_grad();
    Tensor b = random_tensor({3}, gen).set_requires_grad();
    Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3});
    gradcheck(
        [&](const std::vector<Tensor>& in) {
          return batch_norm(in[0], in[1], in[2], rm, rv, true, 0.1, 1e-3);
        },
        {x, w, b}, opt);
    // affine=false and no running statistics
    gradcheck(
        [&](const std::vector<Tensor>& in) {
          return batch_norm(in[0], {}, {}, {}, {}, true, 0.1, 1e-3);
        },
        {x}, opt);
  }
}

TEST_CASE("batch_norm backward from the output equals the backward from the input", "[norm]") {
  // The op keeps y (and derives x_hat from it) when every |weight| >= 1e-3; both kernels must
  // give the same gradients, in both layouts, training and eval, with negative weights too.
  Generator gen(33);
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    for (bool batch_stats : {true, false}) {
      Tensor x = random_tensor({4, 5, 6, 7}, gen, -3, 3, format);
      Tensor w = Tensor::from_vector(std::vector<float>{0.5f, -1.5f, 2.f, 0.01f, 1.f}, {5});
      Tensor b = random_tensor({5}, gen);
      Tensor dy = random_tensor({4, 5, 6, 7}, gen, -1, 1, format);
      Tensor mean = random_tensor({5}, gen), var = random_tensor({5}, gen, 0.5f, 2.f);
      Tensor y = Tensor::empty_like(x);
      kernels::batch_norm_forward.get(x.device())(x, w, b, mean, var, batch_stats, true, 1e-3, y);
      Tensor dx_in = Tensor::empty_like(x), dx_out = Tensor::empty_like(x);
      Tensor dw_in = Tensor::empty({5}), db_in = Tensor::empty({5});
      Tensor dw_out = Tensor::empty({5}), db_out = Tensor::empty({5});
      kernels::batch_norm_backward.get(x.device())(x, dy, w, b, mean, var, batch_stats, 1e-3, dx_in,
                                                   dw_in, db_in);
      kernels::batch_norm_backward_from_output.get(x.device())(
          y, dy, w, b, var, batch_stats, 1e-3, Activation::none, dx_out, dw_out, db_out);
      CHECK(max_rel_error(dx_out.to_float_vector(), dx_in.to_float_vector()) < 1e-4);
      CHECK(max_rel_error(dw_out.to_float_vector(), dw_in.to_float_vector()) < 1e-4);
      CHECK(max_rel_error(db_out.to_float_vector(), db_in.to_float_vector()) < 1e-5);
    }
  }
}

TEST_CASE("batch_norm with a zero weight keeps its input for the backward", "[norm]") {
  // x_hat cannot come from y where the weight is 0: the gradients stay exact and finite.
  Generator gen(34);
  dpar::testing::GradcheckOptions opt;
  opt.eps = 1e-3;
  opt.atol = 5e-3;
  Tensor x = random_tensor({3, 2, 2, 3}, gen, -2, 2).set_requires_grad();
  Tensor w = Tensor::from_vector(std::vector<float>{0.f, 1.2f}, {2}).set_requires_grad();
  Tensor b = random_tensor({2}, gen).set_requires_grad();
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], in[1], in[2], {}, {}, true, 0.1, 1e-3);
      },
      {x, w, b}, opt);
}

TEST_CASE("batch_norm_act equals batch_norm then the activation", "[norm]") {
  // The fused op gives the separate ops' output bitwise and their gradients (formed in one
  // kernel from y) to rounding; also on the path that keeps the input (a zero weight).
  Generator gen(35);
  for (Activation act : {Activation::relu, Activation::hardswish}) {
    for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
      for (float w0 : {0.7f, 0.f}) {
        for (bool training : {true, false}) {
          Tensor x = random_tensor({3, 4, 5, 6}, gen, -4, 4, format);
          Tensor w = Tensor::from_vector(std::vector<float>{w0, -1.2f, 2.f, 0.9f}, {4});
          Tensor b = random_tensor({4}, gen, -2, 2);
          Tensor dz = random_tensor({3, 4, 5, 6}, gen);
          auto run = [&](bool fused, std::vector<Tensor>& grads) {
            Tensor xi = x.detach().clone().set_requires_grad();
            Tensor wi = w.detach().clone().set_requires_grad();
            Tensor bi = b.detach().clone().set_requires_grad();
            Tensor rm = Tensor::zeros({4}), rv = Tensor::ones({4});
            Tensor z;
            if (fused) {
              z = batch_norm_act(xi, wi, bi, rm, rv, training, 0.1, 1e-3, act);
            } else {
              Tensor y = batch_norm(xi, wi, bi, rm, rv, training, 0.1, 1e-3);
              z = act == Activation::relu ? relu(y) : hardswish(y);
            }
            sum(mul(z, dz)).backward();
            grads = {xi.grad(), wi.grad(), bi.grad()};
            return z;
          };
          std::vector<Tensor> fused_grads, separate_grads;
          const Tensor fused = run(true, fused_grads);
          const Tensor separate = run(false, separate_grads);
          CHECK(fused.to_float_vector() == separate.to_float_vector());
          for (size_t i = 0; i < 3; ++i) {
            CHECK(max_rel_error(fused_grads[i].to_float_vector(),
                                separate_grads[i].to_float_vector()) < 1e-4);
          }
        }
      }
    }
  }
}

TEST_CASE("batch_norm_act on the CPU keeps only its input, whatever its weights", "[norm]") {
  // The fused CPU path keeps x for the backward, which forms y again from it: neither y nor
  // z is kept (z is recomputed for the op that reads it), so beyond the returned z the op
  // holds no activation, for both activations and with a weight at zero (no x_hat from y).
  Generator gen(37);
  Allocator& allocator = allocator_for(Device::cpu());
  const Shape shape{8, 16, 32, 32};
  const size_t activation_bytes = 8 * 16 * 32 * 32 * sizeof(float);
  Tensor x = random_tensor(shape, gen, -2, 2, MemoryFormat::ChannelsLast).set_requires_grad();
  for (float w0 : {1.f, 0.f}) {
    std::vector<float> weights(16, 1.f);
    weights[0] = w0;
    Tensor w = Tensor::from_vector(weights, {16}).set_requires_grad();
    Tensor b = random_tensor({16}, gen).set_requires_grad();
    for (Activation act : {Activation::relu, Activation::hardswish}) {
      const size_t before = allocator.stats().allocated_bytes;
      Tensor z = batch_norm_act(x, w, b, {}, {}, true, 0.1, 1e-3, act);
      const size_t held = allocator.stats().allocated_bytes - before;  // z and the saved tensors
      INFO((act == Activation::relu ? "relu" : "hardswish")
           << ", weight[0] " << w0 << ": " << held << " bytes held");
      CHECK(held < activation_bytes * 3 / 2);
      sum(z).backward();  // and the gradient still flows (values: the tests around this one)
      CHECK(x.grad().defined());
      x.set_grad(Tensor());
    }
  }
}

TEST_CASE("batch_norm_act gradients", "[norm]") {
  Generator gen(36);
  dpar::testing::GradcheckOptions opt;
  opt.eps = 1e-3;
  opt.atol = 5e-3;
  for (Activation act : {Activation::relu, Activation::hardswish}) {
    Tensor x =
        random_tensor({3, 3, 2, 3}, gen, -2, 2, MemoryFormat::ChannelsLast).set_requires_grad();
    Tensor w = random_tensor({3}, gen, 0.5f, 1.5f).set_requires_grad();
    Tensor b = random_tensor({3}, gen).set_requires_grad();
    gradcheck(
        [&](const std::vector<Tensor>& in) {
          return batch_norm_act(in[0], in[1], in[2], {}, {}, true, 0.1, 1e-3, act);
        },
        {x, w, b}, opt);
  }
}

TEST_CASE("batch_norm eval uses running statistics, forward and backward", "[norm]") {
  Generator gen(33);
  const double eps = 1e-5;
  Tensor x =
      random_tensor({2, 3, 4, 3}, gen, -1, 1, MemoryFormat::ChannelsLast).set_requires_grad();
  Tensor w = random_tensor({3}, gen, 0.5f, 1.5f).set_requires_grad();
  Tensor b = random_tensor({3}, gen).set_requires_grad();
  Tensor rm = random_tensor({3}, gen);
  Tensor rv = random_tensor({3}, gen, 0.5f, 2.f);
  const std::vector<float> rm0 = rm.to_float_vector(), rv0 = rv.to_float_vector();

  const Tensor y = batch_norm(x, w, b, rm, rv, /*training=*/false, 0.1, eps);
  CHECK(max_rel_error(y.to_float_vector(), normalize(x, to_double(rm), to_double(rv), w, b, eps),
                      0.1) < 1e-5);
  CHECK(rm.to_float_vector() == rm0);  // eval leaves the running statistics alone
  CHECK(rv.to_float_vector() == rv0);
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], in[1], in[2], rm, rv, false, 0.1, eps);
      },
      {x, w, b});
  // Only a bias, and a non-dense input (sliced), which runs channels-last.
  Tensor big = random_tensor({2, 3, 4, 6}, gen);
  Tensor xs = big.slice(3, 0, 6, 2).set_requires_grad();
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], {}, in[1], rm, rv, false, 0.1, eps);
      },
      {xs, b});
}

TEST_CASE("batch_norm argument errors name the op and shapes", "[norm]") {
  using Catch::Contains;
  Tensor x = Tensor::zeros({2, 3, 4, 4});
  Tensor c3 = Tensor::ones({3});
  // [N,C] and [N,C,L] are BatchNorm1d's shapes (tests/unit/test_shape_ops.cpp); others are not.
  CHECK_THROWS_WITH(
      batch_norm(Tensor::zeros({2}), c3, c3, c3, c3, true, 0.1, 1e-5),
      Contains("batch_norm: expected [N,C], [N,C,L] or [N,C,H,W]") && Contains("[2]"));
  CHECK_THROWS_WITH(batch_norm(x, Tensor::ones({4}), c3, c3, c3, true, 0.1, 1e-5),
                    Contains("batch_norm: weight must have shape [3]") && Contains("[4]"));
  CHECK_THROWS_WITH(batch_norm(x, c3, Tensor::ones({1, 3}), c3, c3, true, 0.1, 1e-5),
                    Contains("batch_norm: bias must have shape [3]") && Contains("[1,3]"));
  CHECK_THROWS_WITH(batch_norm(x, c3, c3, Tensor::zeros({2}), c3, true, 0.1, 1e-5),
                    Contains("batch_norm: running_mean must have shape [3]"));
  CHECK_THROWS_WITH(batch_norm(x, c3, c3, c3, Tensor::zeros({5}), false, 0.1, 1e-5),
                    Contains("batch_norm: running_var must have shape [3]"));
  CHECK_THROWS_WITH(batch_norm(x, c3, c3, c3, {}, true, 0.1, 1e-5),
                    Contains("batch_norm: running_mean and running_var"));
  CHECK_THROWS_WITH(batch_norm(x.to(DType::f16), c3, c3, c3, c3, true, 0.1, 1e-5),
                    Contains("batch_norm: input has dtype"));
  CHECK_THROWS_WITH(batch_norm(Tensor::zeros({1, 3, 1, 1}), c3, c3, c3, c3, true, 0.1, 1e-5),
                    Contains("batch_norm: expected more than 1 value per channel"));
}

TEST_CASE("global_avg_pool2d forward and gradient in both layouts", "[pool]") {
  Generator gen(34);
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    Tensor x = random_tensor({2, 5, 3, 4}, gen, -1, 1, format).set_requires_grad();
    const Tensor y = global_avg_pool2d(x);
    REQUIRE(y.shape() == Shape{2, 5, 1, 1});
    const std::vector<float> v = x.to_float_vector();
    std::vector<float> expect(10);
    for (int i = 0; i < 10; ++i) {
      double s = 0;
      for (int p = 0; p < 12; ++p) s += v[i * 12 + p];
      expect[i] = static_cast<float>(s / 12);
    }
    CHECK(max_rel_error(y.to_float_vector(), expect, 0.1) < 1e-5);
    gradcheck([](const std::vector<Tensor>& in) { return global_avg_pool2d(in[0]); }, {x});
  }
  // Non-dense input, and a gradient arriving through a broadcast (stride-0) view.
  Tensor big = random_tensor({2, 3, 4, 6}, gen);
  Tensor xs = big.slice(3, 1, 6, 2).set_requires_grad();
  gradcheck([](const std::vector<Tensor>& in) { return global_avg_pool2d(in[0]); }, {xs});
  xs.set_grad(Tensor());
  sum(global_avg_pool2d(xs)).backward();
  CHECK(max_rel_error(xs.grad().to_float_vector(), std::vector<float>(2 * 3 * 4 * 3, 1.f / 12)) <
        1e-6);
}

TEST_CASE("global_avg_pool2d argument errors", "[pool]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(global_avg_pool2d(Tensor::zeros({2, 3, 4})),
                    Contains("global_avg_pool2d: expected a 4-D input") && Contains("[2,3,4]"));
  CHECK_THROWS_WITH(global_avg_pool2d(Tensor::zeros({2, 3, 4, 4}).to(DType::f16)),
                    Contains("global_avg_pool2d: input has dtype"));
}

TEST_CASE("batch_norm and pooling are deterministic", "[norm][pool]") {
  Generator gen(35);
  Tensor x =
      random_tensor({4, 16, 9, 9}, gen, -1, 1, MemoryFormat::ChannelsLast).set_requires_grad();
  Tensor w = random_tensor({16}, gen).set_requires_grad();
  Tensor b = random_tensor({16}, gen).set_requires_grad();
  auto run = [&] {
    for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
    Tensor rm = Tensor::zeros({16}), rv = Tensor::ones({16});
    Tensor y = global_avg_pool2d(batch_norm(x, w, b, rm, rv, true, 0.1, 1e-3));
    sum(mul(y, y)).backward();
    std::vector<float> out = y.to_float_vector();
    for (const Tensor* t : {&x, &w, &b})
      for (float v : t->grad().to_float_vector()) out.push_back(v);
    return out;
  };
  const std::vector<float> a = run(), c = run();
  REQUIRE(a.size() == c.size());
  CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) == 0);
}
