// Optimizers (hand-computed updates, state save/restore, zero_grad semantics, option checks,
// layouts) and learning-rate schedules (hand-computed values). Trajectories against
// torch.optim are in tests/parity/test_optim_parity.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "dpar/dpar.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/lr_scheduler.h"
#include "dpar/optim/rmsprop.h"
#include "dpar/optim/sgd.h"
#include "gradcheck.h"

using namespace dpar;
using namespace dpar::optim;
using Catch::Matchers::Contains;
using dpar::testing::random_tensor;

namespace {

Tensor param(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).set_requires_grad();
}

void check_values(const Tensor& t, const std::vector<float>& expected, float tol = 1e-6f) {
  const std::vector<float> v = t.to_float_vector();
  REQUIRE(v.size() == expected.size());
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i);
    CHECK(v[i] == Approx(expected[i]).margin(tol));
  }
}

}  // namespace

TEST_CASE("SGD updates match hand-computed values", "[optim]") {
  Tensor w = param({1.0f, 2.0f});
  SGD opt({w}, SGDOptions{.lr = 0.1, .momentum = 0.5});
  w.set_grad(Tensor::from_vector(std::vector<float>{0.5f, -1.0f}, {2}));
  opt.step();  // buffer = g; w -= 0.1 * g
  check_values(w, {0.95f, 2.1f});
  opt.step();  // buffer = 0.5 * g + g = 1.5 g
  check_values(w, {0.875f, 2.25f});
  auto state = opt.state_dict();
  REQUIRE(state.size() == 1);
  CHECK(state[0].first == "momentum_buffer.0");
  check_values(state[0].second, {0.75f, -1.5f});
}

TEST_CASE("AdamW first step moves by lr in the gradient's sign", "[optim]") {
  // After one step m/(1-b1) = g and sqrt(v/(1-b2)) = |g|, so the update is lr * sign(g)
  // (eps is negligible here), after decaying p by (1 - lr * wd).
  Tensor w = param({1.0f, -2.0f, 3.0f});
  AdamW opt({w}, AdamWOptions{.lr = 0.1, .weight_decay = 0.5});
  w.set_grad(Tensor::from_vector(std::vector<float>{0.3f, -4.0f, 2.0f}, {3}));
  opt.step();
  check_values(w, {0.95f * 1.0f - 0.1f, 0.95f * -2.0f + 0.1f, 0.95f * 3.0f - 0.1f});
}

TEST_CASE("AdamW's vectorised update gives the bits of its scalar formula", "[optim]") {
  // The CPU kernel runs 16 lanes on AVX-512 (plus a scalar tail, and threads on large
  // tensors); every intermediate must still round as the op sequence below does in scalar
  // code - PyTorch's order, no fused multiply-adds.
  const int64_t n = 100003;
  Generator gen(11);
  Tensor w = testing::random_tensor({n}, gen, -1, 1).set_requires_grad(true);
  const std::vector<float> p0 = w.to_float_vector();
  AdamW opt({w}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  std::vector<float> m(n, 0.f), v(n, 0.f), p = p0;
  for (int t = 1; t <= 2; ++t) {
    const Tensor g = testing::random_tensor({n}, gen, -3, 3);
    w.set_grad(g);
    opt.step();
    const std::vector<float> gv = g.to_float_vector();
    const float decay = static_cast<float>(1.0 - 0.01 * 0.1);
    const float step_size = static_cast<float>(0.01 / (1.0 - std::pow(0.9, t)));
    const float bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t)));
    const float b1 = 0.9f, omb1 = static_cast<float>(1.0 - 0.9), b2 = 0.999f,
                omb2 = static_cast<float>(1.0 - 0.999), eps = 1e-8f;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = gv[i];
      // Each product rounded on its own (volatile keeps the compiler from fusing).
      volatile float m1 = m[i] * b1, m2 = omb1 * gi;
      m[i] = m1 + m2;
      volatile float v1 = v[i] * b2, v2 = omb2 * gi, v3 = v2 * gi;
      v[i] = v1 + v3;
      const float denom = std::sqrt(v[i]) / bc2 + eps;
      volatile float pd = p[i] * decay, upd = -step_size * m[i];
      p[i] = pd + upd / denom;
    }
  }
  const std::vector<float> got = w.to_float_vector();
  int64_t differing = 0;
  for (int64_t i = 0; i < n; ++i) differing += got[i] != p[i];
  CHECK(differing == 0);
  CHECK(got != p0);
}

TEST_CASE("RMSprop first step", "[optim]") {
  // v = (1 - alpha) g^2, so p -= lr * g / (sqrt(1 - alpha) |g| + eps).
  Tensor w = param({1.0f, 1.0f});
  RMSprop opt({w}, RMSpropOptions{.lr = 0.01, .alpha = 0.75, .eps = 0});
  w.set_grad(Tensor::from_vector(std::vector<float>{2.0f, -0.5f}, {2}));
  opt.step();
  check_values(w, {1.0f - 0.02f, 1.0f + 0.02f});
}

TEST_CASE("zero_grad zeroes in place or drops gradients", "[optim]") {
  Tensor a = param({1, 2, 3});
  Tensor b = param({4});
  SGD opt({a, b}, SGDOptions{.lr = 0.1});
  Tensor ga = Tensor::from_vector(std::vector<float>{1, 1, 1}, {3});
  a.set_grad(ga);
  const void* storage_before = a.grad().raw_data();
  opt.zero_grad();
  REQUIRE(a.grad().defined());
  CHECK(a.grad().is_same(ga));
  CHECK(a.grad().raw_data() == storage_before);
  check_values(ga, {0, 0, 0});
  CHECK_FALSE(b.grad().defined());  // untouched: never had a gradient
  opt.zero_grad(/*set_to_none=*/true);
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("parameters without gradients are skipped", "[optim]") {
  Tensor a = param({1, 2});
  Tensor b = param({3});
  AdamW opt({a, b}, AdamWOptions{.lr = 0.1});
  a.set_grad(Tensor::from_vector(std::vector<float>{1, 1}, {2}));
  opt.step();
  check_values(b, {3});
  auto state = opt.state_dict();
  // Only parameter 0 has state: step.0, exp_avg.0, exp_avg_sq.0.
  REQUIRE(state.size() == 3);
  for (const auto& [key, t] : state) CHECK(key.back() == '0');
}

TEST_CASE("a parameter whose first gradient comes late counts its own steps", "[optim]") {
  // The bias corrections use each parameter's step count; b starts a step after a.
  Tensor a = param({1, 2});
  Tensor b = param({3});
  Tensor b_alone = param({3});
  AdamW opt({a, b}, AdamWOptions{.lr = 0.1});
  AdamW ref({b_alone}, AdamWOptions{.lr = 0.1});
  a.set_grad(Tensor::from_vector(std::vector<float>{1, -1}, {2}));
  opt.step();
  b.set_grad(Tensor::from_vector(std::vector<float>{0.5f}, {1}));
  b_alone.set_grad(b.grad());
  opt.step();
  ref.step();
  CHECK(b.to_float_vector() == b_alone.to_float_vector());
  std::map<std::string, double> steps;
  for (const auto& [key, t] : opt.state_dict()) {
    if (key.rfind("step.", 0) == 0) steps[key] = t.item();
  }
  CHECK(steps == std::map<std::string, double>{{"step.0", 2}, {"step.1", 1}});
}

TEST_CASE("DPAR_OPTIM_MULTI_TENSOR and set_multi_tensor choose the update path", "[optim]") {
  // The CPU has no multi-tensor kernels, so the switch does not change CPU results; the CUDA
  // comparison of both paths is tests/gpu/test_cuda_optim_multi.cpp.
  Tensor w = param({1, 2});
  ::unsetenv("DPAR_OPTIM_MULTI_TENSOR");
  CHECK(SGD({w}, SGDOptions{.lr = 0.1}).multi_tensor());
  ::setenv("DPAR_OPTIM_MULTI_TENSOR", "0", 1);
  AdamW off({w}, AdamWOptions{.lr = 0.1});
  CHECK_FALSE(off.multi_tensor());
  ::setenv("DPAR_OPTIM_MULTI_TENSOR", "1", 1);
  CHECK(RMSprop({w}).multi_tensor());
  ::setenv("DPAR_OPTIM_MULTI_TENSOR", "yes", 1);
  CHECK_THROWS_WITH(SGD({w}, SGDOptions{.lr = 0.1}),
                    Contains("DPAR_OPTIM_MULTI_TENSOR: expected 0 or 1, got 'yes'"));
  ::unsetenv("DPAR_OPTIM_MULTI_TENSOR");

  Tensor v = param({1, 2});
  AdamW on({v}, AdamWOptions{.lr = 0.1});
  for (int s = 0; s < 2; ++s) {
    w.set_grad(Tensor::from_vector(std::vector<float>{0.5f, -2}, {2}));
    v.set_grad(w.grad());
    off.step();
    on.step();
  }
  CHECK(w.to_float_vector() == v.to_float_vector());
  off.set_multi_tensor(true);
  CHECK(off.multi_tensor());
}

TEST_CASE("optimizer option and parameter checks", "[optim]") {
  Tensor w = param({1});
  CHECK_THROWS_WITH(SGD({w}, SGDOptions{.lr = -0.1}), Contains("learning rate must be >= 0"));
  CHECK_THROWS_WITH(SGD({w}, SGDOptions{}), Contains("learning rate"));
  CHECK_THROWS_WITH(SGD({w}, SGDOptions{.lr = 0.1, .nesterov = true}),
                    Contains("nesterov requires momentum"));
  CHECK_THROWS_WITH(SGD({w}, SGDOptions{.lr = 0.1, .momentum = -1}), Contains("momentum"));
  CHECK_THROWS_WITH(RMSprop({w}, RMSpropOptions{.alpha = -0.5}), Contains("alpha"));
  CHECK_THROWS_WITH(AdamW({w}, AdamWOptions{.beta1 = 1.0}), Contains("beta1"));
  CHECK_THROWS_WITH(AdamW({w}, AdamWOptions{.eps = -1}), Contains("eps"));
  CHECK_THROWS_WITH(SGD({}, SGDOptions{.lr = 0.1}), Contains("empty parameter list"));
  CHECK_THROWS_WITH(SGD({w, w}, SGDOptions{.lr = 0.1}), Contains("same tensor as parameter 0"));
  CHECK_THROWS_WITH(SGD({mul(w, 2.0)}, SGDOptions{.lr = 0.1}), Contains("not a leaf"));
  SGD opt({w}, SGDOptions{.lr = 0.1});
  CHECK_THROWS_WITH(opt.set_lr(-1), Contains("learning rate"));
}

TEST_CASE("optimizer state round-trips through state_dict", "[optim]") {
  Generator gen(3);
  auto run = [&](auto make) {
    Tensor w1 = random_tensor({5, 4}, gen).set_requires_grad();
    Tensor w2 = w1.detach().clone().set_requires_grad();
    auto opt1 = make(w1);
    for (int s = 0; s < 3; ++s) {
      w1.set_grad(random_tensor({5, 4}, gen));
      opt1->step();
    }
    // A fresh optimizer on a copy of the parameter, with the saved state.
    w2.detach().copy_(w1);
    auto opt2 = make(w2);
    StateDict saved = opt1->state_dict();
    opt2->load_state_dict(saved);
    Tensor g = random_tensor({5, 4}, gen);
    w1.set_grad(g);
    w2.set_grad(g.clone());
    opt1->step();
    opt2->step();
    CHECK(w1.to_float_vector() == w2.to_float_vector());
  };
  run([](Tensor w) {
    return std::make_unique<SGD>(std::vector<Tensor>{w}, SGDOptions{.lr = 0.1, .momentum = 0.9});
  });
  run([](Tensor w) {
    return std::make_unique<RMSprop>(std::vector<Tensor>{w},
                                     RMSpropOptions{.momentum = 0.5, .centered = true});
  });
  run([](Tensor w) { return std::make_unique<AdamW>(std::vector<Tensor>{w}); });
}

TEST_CASE("loading a mismatched optimizer state is an error", "[optim]") {
  Tensor w = param({1, 2});
  AdamW adam({w});
  w.set_grad(Tensor::ones({2}));
  adam.step();
  StateDict adam_state = adam.state_dict();
  CHECK(adam_state.size() == 3);

  Tensor v = param({1, 2});
  SGD sgd({v}, SGDOptions{.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_WITH(sgd.load_state_dict(adam_state), Contains("unexpected entry"));
  CHECK_THROWS_WITH(sgd.load_state_dict({{"momentum_buffer.0", Tensor::zeros({3})}}),
                    Contains("has shape [3], parameter 0 has shape [2]"));
  CHECK_THROWS_WITH(sgd.load_state_dict({{"momentum_buffer.4", Tensor::zeros({2})}}),
                    Contains("refers to parameter 4"));
  CHECK_THROWS_WITH(sgd.load_state_dict({{"momentum_buffer", Tensor::zeros({2})}}),
                    Contains("parameter index"));
  SGD plain({v}, SGDOptions{.lr = 0.1});
  CHECK_THROWS_WITH(plain.load_state_dict({{"momentum_buffer.0", Tensor::zeros({2})}}),
                    Contains("keeps no state"));
  AdamW adam2({v});
  StateDict incomplete(adam_state.begin(), adam_state.begin() + 2);
  CHECK_THROWS_WITH(adam2.load_state_dict(incomplete), Contains("has state but no"));
  // A failed load leaves the state alone; a good one replaces it.
  CHECK(adam2.state_dict().empty());
  adam2.load_state_dict(adam_state);
  CHECK(adam2.state_dict().size() == 3);
}

TEST_CASE("optimizers handle non-dense parameters and gradients in another layout", "[optim]") {
  Generator gen(5);
  // A parameter with gaps in memory (every other element of a buffer).
  Tensor gappy = Tensor::empty_strided({3, 4}, {8, 1});
  Tensor dense = random_tensor({3, 4}, gen);
  gappy.copy_(dense);
  gappy.set_requires_grad();
  dense.set_requires_grad();
  // A channels-last gradient for a contiguous 4-D parameter.
  Tensor w4 = random_tensor({2, 3, 2, 2}, gen).set_requires_grad();
  Tensor w4_ref = w4.detach().clone().set_requires_grad();
  Tensor g4 = random_tensor({2, 3, 2, 2}, gen, -1, 1, MemoryFormat::ChannelsLast);
  Tensor g = random_tensor({3, 4}, gen);

  AdamW opt({gappy, w4}, AdamWOptions{.lr = 0.1});
  AdamW ref({dense, w4_ref}, AdamWOptions{.lr = 0.1});
  for (int s = 0; s < 2; ++s) {
    gappy.set_grad(g);
    dense.set_grad(g);
    w4.set_grad(g4);
    w4_ref.set_grad(g4.contiguous());
    opt.step();
    ref.step();
  }
  CHECK(gappy.strides() == Shape{8, 1});
  CHECK(gappy.to_float_vector() == dense.to_float_vector());
  CHECK(w4.is_contiguous());
  CHECK(w4.to_float_vector() == w4_ref.to_float_vector());
}

TEST_CASE("large updates are bitwise identical across thread counts", "[optim]") {
  Generator gen(11);
  Tensor init = random_tensor({300, 300}, gen);
  Tensor g = random_tensor({300, 300}, gen);
  std::vector<std::vector<float>> results;
  const int threads_before = get_num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor w = init.clone().set_requires_grad();
    RMSprop opt({w}, RMSpropOptions{.momentum = 0.9, .centered = true});
    for (int s = 0; s < 3; ++s) {
      w.set_grad(g);
      opt.step();
    }
    results.push_back(w.to_float_vector());
  }
  set_num_threads(threads_before);
  CHECK(results[0] == results[1]);
}

TEST_CASE("StepLR", "[optim][sched]") {
  Tensor w = param({1});
  SGD opt({w}, SGDOptions{.lr = 0.1});
  StepLR sched(opt, /*step_size=*/2, /*gamma=*/0.5);
  const std::vector<double> expected{0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.0125};
  for (size_t s = 0; s < expected.size(); ++s) {
    INFO("step " << s);
    CHECK(sched.last_step() == static_cast<int64_t>(s));
    CHECK(sched.get_lr() == Approx(expected[s]).epsilon(1e-12));
    CHECK(opt.lr() == Approx(expected[s]).epsilon(1e-12));
    sched.step();
  }
  CHECK_THROWS_WITH(StepLR(opt, 0), Contains("step_size must be > 0"));
}

TEST_CASE("PiecewiseLR", "[optim][sched]") {
  Tensor w = param({1});
  SGD opt({w}, SGDOptions{.lr = 0.5});
  PiecewiseLR sched(opt, {3, 6}, {0.1, 0.01, 0.001});
  const std::vector<double> expected{0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001};
  for (size_t s = 0; s < expected.size(); ++s) {
    INFO("step " << s);
    CHECK(opt.lr() == expected[s]);
    sched.step();
  }
  CHECK_THROWS_WITH(PiecewiseLR(opt, {3, 6}, {0.1, 0.01}), Contains("expected 3 values"));
  CHECK_THROWS_WITH(PiecewiseLR(opt, {6, 3}, {0.1, 0.01, 0.001}), Contains("strictly increasing"));
}

TEST_CASE("CosineWarmupLR", "[optim][sched]") {
  Tensor w = param({1});
  SGD opt({w}, SGDOptions{.lr = 0.1});
  CosineWarmupLR sched(opt, /*total_steps=*/10, /*warmup_steps=*/2, /*warmup_start_lr=*/0.01,
                       /*min_lr=*/0.001);
  // Warmup: 0.01, 0.055; cosine over 8 steps from 0.1 to 0.001:
  // 0.001 + 0.099 * (1 + cos(pi * t / 8)) / 2 for t = 0..8, then 0.001.
  const double pi = 3.14159265358979323846;
  std::vector<double> expected{0.01, 0.055};
  for (int t = 0; t <= 8; ++t) expected.push_back(0.001 + 0.0495 * (1 + std::cos(pi * t / 8)));
  expected.push_back(0.001);
  expected.push_back(0.001);
  CHECK(expected[6] == Approx(0.0505));      // halfway through the cosine
  CHECK(expected[4] == Approx(0.08550178));  // a quarter of the way: 0.001 + 0.0495 * 1.7071
  for (size_t s = 0; s < expected.size(); ++s) {
    INFO("step " << s);
    CHECK(opt.lr() == Approx(expected[s]).epsilon(1e-12));
    sched.step();
  }
  // Without warmup the schedule starts at the base lr.
  SGD opt2({param({1})}, SGDOptions{.lr = 0.2});
  CosineWarmupLR no_warmup(opt2, 4);
  CHECK(opt2.lr() == Approx(0.2));
  no_warmup.step();
  CHECK(opt2.lr() == Approx(0.1 * (1 + std::cos(pi / 4))));
  CHECK_THROWS_WITH(CosineWarmupLR(opt, 10, 11), Contains("warmup_steps must be in"));
}

TEST_CASE("scheduler state save and restore", "[optim][sched]") {
  Tensor w = param({1});
  SGD opt({w}, SGDOptions{.lr = 0.1});
  CosineWarmupLR sched(opt, 20, 5);
  for (int i = 0; i < 7; ++i) sched.step();
  StateDict saved = sched.state_dict();

  SGD opt2({param({1})}, SGDOptions{.lr = 0.1});
  CosineWarmupLR restored(opt2, 20, 5);
  restored.load_state_dict(saved);
  CHECK(restored.last_step() == 7);
  CHECK(opt2.lr() == opt.lr());
  sched.step();
  restored.step();
  CHECK(opt2.lr() == opt.lr());
  CHECK_THROWS_WITH(restored.load_state_dict({{"epoch", Tensor::zeros({1})}}),
                    Contains("unexpected entry 'epoch'"));
}
