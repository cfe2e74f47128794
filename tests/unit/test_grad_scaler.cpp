// amp::GradScaler: scaling and unscaling, skipped steps on inf/nan, the scale's backoff and
// growth, exactness of scaled training against plain training, option and call-order errors,
// state save/restore, and the unscale_and_check_finite kernel itself. The CUDA kernel is
// compared with this one in tests/gpu/test_cuda_amp.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "dpar/dpar.h"
#include "dpar/optim/grad_scaler.h"
#include "gradcheck.h"
#include "optim/amp_kernels.h"
#include "unit/helpers.h"

using namespace dpar;
using amp::GradScaler;
using amp::GradScalerOptions;
using Catch::Matchers::Contains;
using dpar::testing::random_tensor;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

Tensor param(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).set_requires_grad();
}

Tensor vec(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// Bitwise comparison (nan == nan when the bits agree).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("scale() multiplies the loss and backward carries the scale", "[amp]") {
  GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  Tensor w = param({1.5f, -2.0f, 0.25f});
  const Tensor x = vec({3.0f, 0.5f, -1.0f});
  const Tensor loss = sum(mul(w, x));
  const Tensor scaled = scaler.scale(loss);
  CHECK(scaled.item() == loss.item() * 65536.0);
  scaled.backward();
  CHECK(w.grad().to_float_vector() == std::vector<float>{3.0f * 65536, 0.5f * 65536, -65536.0f});

  // The per-op finite-difference convention: scale() is a multiply by a constant.
  GradScaler small(GradScalerOptions{.init_scale = 8});
  Generator gen(7);
  dpar::testing::gradcheck([&](const std::vector<Tensor>& in) { return small.scale(in[0]); },
                           {random_tensor({2, 3}, gen).set_requires_grad()});
}

TEST_CASE("unscale divides every gradient exactly, in place", "[amp]") {
  GradScaler scaler(GradScalerOptions{.init_scale = 1024});
  Tensor a = param({1, 2, 3}), b = param({4, 5}), c = param({6});  // c has no gradient
  optim::SGD opt({a, b, c}, optim::SGDOptions{.lr = 0.1});
  a.set_grad(vec({1024.0f, -3072.0f, 0.5f}));
  b.set_grad(vec({2048.0f, 1e-3f}));
  const void* storage = a.grad().raw_data();
  scaler.unscale(opt);
  CHECK(a.grad().raw_data() == storage);
  CHECK(a.grad().to_float_vector() == std::vector<float>{1.0f, -3.0f, 0.5f / 1024});
  CHECK(b.grad().to_float_vector() == std::vector<float>{2.0f, 1e-3f / 1024});
  CHECK_FALSE(c.grad().defined());
  CHECK(scaler.step(opt));  // already unscaled: step() does not divide again
  CHECK(a.to_float_vector() ==
        std::vector<float>{1 - 0.1f * 1.0f, 2 + 0.1f * 3.0f, 3 - 0.1f * (0.5f / 1024)});
  scaler.update();
}

TEST_CASE("unscale handles non-dense gradients through a copy", "[amp]") {
  GradScaler scaler(GradScalerOptions{.init_scale = 4});
  Tensor w = param({0, 0, 0, 0});
  optim::SGD opt({w}, optim::SGDOptions{.lr = 0.1});
  Tensor backing = vec({4, 100, 8, 100, -12, 100, kInf, 100});
  w.set_grad(backing.slice(0, 0, 8, 2));  // every other element: not dense
  CHECK_FALSE(scaler.step(opt));
  CHECK(backing.to_float_vector() == std::vector<float>{1, 100, 2, 100, -3, 100, kInf, 100});
  CHECK(w.to_float_vector() == std::vector<float>{0, 0, 0, 0});
}

TEST_CASE("an inf or nan gradient skips the step and backs the scale off", "[amp]") {
  for (const float bad : {kInf, -kInf, kNan}) {
    INFO("bad value " << bad);
    GradScaler scaler(GradScalerOptions{.init_scale = 256, .growth_interval = 3});
    Tensor a = param({1, 2}), b = param({3, 4, 5});
    optim::SGD opt({a, b}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    // One finite step first, so the growth tracker has something to reset.
    a.set_grad(vec({256, 256}));
    b.set_grad(vec({256, 256, 256}));
    CHECK(scaler.step(opt));
    scaler.update();
    CHECK(scaler.growth_tracker() == 1);
    const std::vector<float> a_before = a.to_float_vector(), b_before = b.to_float_vector();
    const auto state_before = opt.state_dict();

    a.set_grad(vec({256, 256}));
    b.set_grad(vec({256, bad, 256}));
    CHECK_FALSE(scaler.step(opt));
    CHECK(scaler.skipped_steps() == 1);
    CHECK(a.to_float_vector() == a_before);
    CHECK(b.to_float_vector() == b_before);
    // The momentum buffers did not advance either.
    const auto state_after = opt.state_dict();
    REQUIRE(state_after.size() == state_before.size());
    for (size_t i = 0; i < state_after.size(); ++i) {
      CHECK(state_after[i].second.to_float_vector() == state_before[i].second.to_float_vector());
    }
    scaler.update();
    CHECK(scaler.get_scale() == 128.0);
    CHECK(scaler.growth_tracker() == 0);
  }
}

TEST_CASE("the scale grows after growth_interval finite steps in a row", "[amp]") {
  GradScaler scaler(GradScalerOptions{.init_scale = 4, .growth_interval = 3});
  Tensor w = param({1});
  optim::SGD opt({w}, optim::SGDOptions{.lr = 0.1});
  auto iteration = [&](float g) {
    w.set_grad(vec({g}));
    scaler.step(opt);
    scaler.update();
  };
  iteration(1);
  iteration(1);
  CHECK(scaler.get_scale() == 4.0);
  CHECK(scaler.growth_tracker() == 2);
  iteration(1);
  CHECK(scaler.get_scale() == 8.0);
  CHECK(scaler.growth_tracker() == 0);
  iteration(1);
  iteration(1);
  iteration(kNan);  // resets the count and halves
  CHECK(scaler.get_scale() == 4.0);
  iteration(1);
  iteration(1);
  CHECK(scaler.get_scale() == 4.0);
  iteration(1);
  CHECK(scaler.get_scale() == 8.0);
  CHECK(scaler.skipped_steps() == 1);

  // Growth stops where f32 would overflow (2^128 is inf in f32).
  GradScaler top(GradScalerOptions{.init_scale = std::ldexp(1.0, 127), .growth_interval = 1});
  w.set_grad(vec({1}));
  top.step(opt);
  top.update();
  CHECK(top.get_scale() == std::ldexp(1.0, 127));
}

TEST_CASE("scaled training equals plain training bitwise for power-of-two scales", "[amp]") {
  struct Run {
    std::shared_ptr<nn::Sequential> net;
    std::unique_ptr<optim::SGD> opt;
    Run() {
      manual_seed(5);
      net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
          std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(8, 3)});
      opt = std::make_unique<optim::SGD>(
          net->parameters(),
          optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
    }
    Tensor loss(int64_t step) {
      Generator gen(100 + static_cast<uint64_t>(step));
      const Tensor x = random_tensor({5, 6}, gen);
      std::vector<int64_t> labels(5);
      for (int64_t& l : labels) l = static_cast<int64_t>(gen.uniform() * 3) % 3;
      opt->zero_grad();
      return cross_entropy(net->forward(x), Tensor::from_vector(labels, {5}));
    }
    std::vector<float> params() const {
      std::vector<float> all;
      for (const Tensor& p : net->parameters()) {
        const std::vector<float> v = p.to_float_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
      return all;
    }
  };
  Run plain, scaled, rough;
  // growth_interval 2 makes the scale change during the run: 2^10, 2^11, 2^12, ...
  GradScaler scaler(GradScalerOptions{.init_scale = 1024, .growth_interval = 2});
  GradScaler odd(GradScalerOptions{.init_scale = 1000, .growth_factor = 3, .growth_interval = 2});
  for (int64_t step = 0; step < 8; ++step) {
    plain.loss(step).backward();
    plain.opt->step();
    scaler.scale(scaled.loss(step)).backward();
    CHECK(scaler.step(*scaled.opt));
    scaler.update();
    odd.scale(rough.loss(step)).backward();
    CHECK(odd.step(*rough.opt));
    odd.update();
  }
  CHECK(scaler.get_scale() == 1024.0 * 16);
  CHECK(scaler.skipped_steps() == 0);
  CHECK(same_bits(plain.params(), scaled.params()));
  // Other scales round differently but stay within f32 noise.
  const std::vector<float> p = plain.params(), r = rough.params();
  for (size_t i = 0; i < p.size(); ++i) CHECK(r[i] == Approx(p[i]).epsilon(1e-5).margin(1e-6));
}

TEST_CASE("a disabled scaler passes everything through", "[amp]") {
  GradScaler scaler(GradScalerOptions{.enabled = false});
  CHECK(scaler.get_scale() == 1.0);
  Tensor w = param({1, 2});
  optim::SGD opt({w}, optim::SGDOptions{.lr = 0.5});
  const Tensor loss = sum(mul(w, w));
  CHECK(scaler.scale(loss).is_same(loss));
  w.set_grad(vec({2, kInf}));
  scaler.unscale(opt);
  CHECK(w.grad().to_float_vector() == std::vector<float>{2, kInf});
  CHECK(scaler.step(opt));  // steps even on inf: nothing is checked
  CHECK(w.to_float_vector()[0] == 0.0f);
  scaler.update();
  CHECK(scaler.skipped_steps() == 0);
  CHECK(scaler.state_dict().empty());
  scaler.load_state_dict({});  // ignored, as in PyTorch
}

TEST_CASE("bad options are one error line naming the option and value", "[amp]") {
  auto err = [](const GradScalerOptions& o) { return error_of([&] { GradScaler s(o); }); };
  CHECK_THAT(err({.init_scale = 0}),
             Contains("GradScaler: init_scale must be > 0") && Contains("got 0"));
  CHECK_THAT(err({.init_scale = -2}), Contains("init_scale") && Contains("got -2"));
  CHECK_THAT(err({.init_scale = 1e300}), Contains("init_scale") && Contains("1e+300"));
  CHECK_THAT(err({.init_scale = std::nan("")}), Contains("init_scale") && Contains("nan"));
  CHECK_THAT(err({.growth_factor = 1}),
             Contains("GradScaler: growth_factor must be finite and > 1, got 1"));
  CHECK_THAT(err({.growth_factor = HUGE_VAL}), Contains("growth_factor") && Contains("inf"));
  CHECK_THAT(err({.backoff_factor = 1}),
             Contains("GradScaler: backoff_factor must be in (0, 1), got 1"));
  CHECK_THAT(err({.backoff_factor = 0}), Contains("backoff_factor") && Contains("got 0"));
  CHECK_THAT(err({.growth_interval = 0}),
             Contains("GradScaler: growth_interval must be >= 1, got 0"));
  const std::string msg = err({.growth_factor = 0.5});
  CHECK(msg.find('\n') == std::string::npos);
  CHECK_THAT(err({.backoff_factor = 2, .enabled = false}), Contains("backoff_factor"));
}

TEST_CASE("unscale and step follow PyTorch's call order", "[amp]") {
  GradScaler scaler(GradScalerOptions{.init_scale = 2});
  Tensor w = param({1, 2});
  optim::SGD opt({w}, optim::SGDOptions{.lr = 0.1});
  w.set_grad(vec({2, 2}));
  scaler.unscale(opt);
  CHECK_THAT(error_of([&] { scaler.unscale(opt); }),
             Contains("GradScaler::unscale: already called for this SGD optimizer"));
  CHECK(w.grad().to_float_vector() == std::vector<float>{1, 1});  // not divided twice
  CHECK(scaler.step(opt));
  CHECK_THAT(error_of([&] { scaler.step(opt); }), Contains("GradScaler::step: already called"));
  CHECK_THAT(error_of([&] { scaler.unscale(opt); }), Contains("called after step()"));
  scaler.update();
  CHECK_THAT(error_of([&] { scaler.update(); }), Contains("no inf/nan checks were recorded"));
  // After update() the next iteration may unscale again.
  w.set_grad(vec({2, 2}));
  scaler.unscale(opt);
  CHECK(w.grad().to_float_vector() == std::vector<float>{1, 1});
  scaler.update();

  Tensor none = param({1});
  optim::SGD idle({none}, optim::SGDOptions{.lr = 0.1});
  CHECK_THAT(error_of([&] { scaler.step(idle); }), Contains("has a gradient"));
}

TEST_CASE("the scaler's state round-trips through state_dict", "[amp]") {
  GradScaler a(GradScalerOptions{.init_scale = 64, .growth_interval = 3});
  Tensor w = param({1});
  optim::SGD opt({w}, optim::SGDOptions{.lr = 0.1});
  auto iteration = [&](GradScaler& s, float g) {
    w.set_grad(vec({g}));
    s.step(opt);
    s.update();
  };
  iteration(a, kInf);  // 32
  iteration(a, 1);
  iteration(a, 1);  // tracker 2
  const optim::StateDict state = a.state_dict();
  REQUIRE(state.size() == 2);
  CHECK(state[0].first == "scale");
  CHECK(state[0].second.item() == 32.0);
  CHECK(state[1].first == "growth_tracker");
  CHECK(state[1].second.item() == 2.0);

  GradScaler b(GradScalerOptions{.growth_interval = 3});
  b.load_state_dict(state);
  CHECK(b.get_scale() == 32.0);
  CHECK(b.growth_tracker() == 2);
  iteration(b, 1);  // the restored tracker completes the interval
  CHECK(b.get_scale() == 64.0);

  auto load_err = [&](const optim::StateDict& s) {
    return error_of([&] { b.load_state_dict(s); });
  };
  const Tensor one = Tensor::from_vector(std::vector<float>{1}, {});
  const Tensor zero = Tensor::from_vector(std::vector<int64_t>{0}, {});
  CHECK_THAT(load_err({}), Contains("empty"));
  CHECK_THAT(load_err({{"scale", one}}), Contains("missing entry 'growth_tracker'"));
  CHECK_THAT(load_err({{"scale", one}, {"growth_tracker", zero}, {"step", zero}}),
             Contains("unexpected entry 'step'"));
  CHECK_THAT(load_err({{"scale", Tensor::from_vector(std::vector<float>{-1}, {})},
                       {"growth_tracker", zero}}),
             Contains("'scale' must be > 0") && Contains("got -1"));
  CHECK_THAT(load_err({{"scale", one},
                       {"growth_tracker", Tensor::from_vector(std::vector<float>{0.5f}, {})}}),
             Contains("'growth_tracker' must be a count"));
  CHECK(b.get_scale() == 64.0);  // failed loads changed nothing
}

TEST_CASE("unscale_and_check_finite: one pass, flag only ever set", "[amp]") {
  const auto kernel = kernels::unscale_and_check_finite.get(Device::cpu());
  Tensor flag = Tensor::zeros({}, DType::f32);
  // Large enough for the threaded path; values and the multiply are exact in f32.
  const int64_t n = 100003;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i % 977) - 488;
  Tensor g = Tensor::from_vector(v, {n});
  kernel(g, 0.125f, flag);
  CHECK(flag.item() == 0.0);
  std::vector<float> expected = v;
  for (float& x : expected) x *= 0.125f;
  CHECK(g.to_float_vector() == expected);

  v[static_cast<size_t>(n - 1)] = kNan;
  Tensor bad = Tensor::from_vector(v, {n});
  kernel(bad, 0.125f, flag);
  CHECK(flag.item() == 1.0);
  kernel(g, 1.0f, flag);  // a later finite gradient does not clear it
  CHECK(flag.item() == 1.0);

  // A finite value that overflows when multiplied (a scale below 1) counts as inf.
  Tensor small = Tensor::zeros({}, DType::f32);
  Tensor big = vec({3e38f, 1.0f});
  kernel(big, 2.0f, small);
  CHECK(small.item() == 1.0);
}

TEST_CASE("amp::Autocast scopes nest per thread, and CPU ops follow bf16 but not f16") {
  CHECK(dpar::amp::autocast_dtype() == dpar::DType::f32);
  const dpar::Tensor a = dpar::Tensor::full({4, 6}, 0.1), b = dpar::Tensor::full({6, 3}, 0.3);
  const std::vector<float> plain = dpar::matmul(a, b).to_float_vector();
  {
    dpar::amp::Autocast outer(dpar::DType::bf16);
    CHECK(dpar::amp::autocast_dtype() == dpar::DType::bf16);
    {
      dpar::amp::Autocast inner(dpar::DType::f16);
      CHECK(dpar::amp::autocast_dtype() == dpar::DType::f16);
      dpar::amp::Autocast off(dpar::DType::f32, /*enabled=*/false);
      CHECK(dpar::amp::autocast_dtype() == dpar::DType::f16);
    }
    CHECK(dpar::amp::autocast_dtype() == dpar::DType::bf16);
    // Another thread has its own setting.
    dpar::DType seen = dpar::DType::u8;
    std::thread([&] { seen = dpar::amp::autocast_dtype(); }).join();
    CHECK(seen == dpar::DType::f32);
    // CPU products run in bf16 where oneDNN has bf16 kernels (tests/unit/test_cpu_bf16_ops).
    if (dpar::amp::cpu_bf16_support() != dpar::amp::CpuBf16::unsupported) {
      CHECK(dpar::matmul(a, b).dtype() == dpar::DType::bf16);
    }
    // Under f16 they are unaffected: f32, bitwise the result without autocast.
    dpar::amp::Autocast f16(dpar::DType::f16);
    const dpar::Tensor y = dpar::matmul(a, b);
    CHECK(y.dtype() == dpar::DType::f32);
    CHECK(y.to_float_vector() == plain);
  }
  CHECK(dpar::amp::autocast_dtype() == dpar::DType::f32);
  CHECK_THROWS_WITH(dpar::amp::Autocast(dpar::DType::i64),
                    Catch::Contains("amp::Autocast: expected f16, bf16 or f32, got i64"));
}
