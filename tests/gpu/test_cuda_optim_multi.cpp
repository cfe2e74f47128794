// The multi-tensor optimizer path on CUDA (one kernel-slot call per step for all parameters of
// the device) against the per-parameter CUDA kernels, which it must equal bitwise, and the
// CPU backend (1e-6 relative over the whole list; the GPU contracts a*b+c into FMAs, the CPU
// build does not). The parameter list mixes sizes from 1 element to over 1M, channels-last
// and non-dense parameters, gradients in another layout, parameters that never get a
// gradient and ones whose first gradient comes a step late (so the momentum-buffer start and
// the AdamW step counts differ between parameters of one call).
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "gpu/gpu_helpers.h"
#include "optim/optim_kernels.h"

using namespace dpar;

namespace {

enum class Layout { Contiguous, ChannelsLast, Gappy };

struct Spec {
  Shape shape;
  Layout param = Layout::Contiguous;
  Layout grad = Layout::Contiguous;
};

// ~40 parameters shaped like a small CNN's: BatchNorm vectors, conv and linear weights, sizes
// around the multi-tensor kernels' 4096-element chunks, one empty and two of over 1M elements.
std::vector<Spec> varied_specs() {
  using L = Layout;
  return {
      {{1}},
      {{2}},
      {{3}, L::Contiguous, L::Gappy},
      {{7}, L::Gappy},
      {{16}},
      {{16}},
      {{31}},
      {{0, 4}},
      {{64}},
      {{100}},
      {{255}},
      {{256}},
      {{257}, L::Gappy, L::Gappy},
      {{1000}},
      {{1024}},
      {{4095}},
      {{4096}},
      {{4097}},
      {{8197}},
      {{16, 3, 3, 3}},
      {{16, 3, 3, 3}, L::ChannelsLast},
      {{16, 1, 3, 3}, L::ChannelsLast, L::Contiguous},
      {{8, 16, 1, 1}},
      {{72, 16, 1, 1}, L::Contiguous, L::ChannelsLast},
      {{72}},
      {{24, 72, 1, 1}},
      {{96, 1, 5, 5}, L::ChannelsLast},
      {{40, 96, 5, 5}, L::ChannelsLast, L::ChannelsLast},
      {{40, 96, 5, 5}},
      {{576, 96, 1, 1}},
      {{3, 5}, L::Gappy},
      {{64, 33}, L::Gappy, L::Contiguous},
      {{300, 257}},
      {{300, 257}, L::Contiguous, L::Gappy},
      {{1024, 576}},
      {{1000, 1024}},
      {{1100, 1000}},
      {{1000}},
      {{13, 7, 3, 2}, L::Gappy},
      {{5}},
  };
}

// More tiny parameters than one multi-tensor launch holds (a few hundred), so a step takes
// several launches.
std::vector<Spec> many_small_specs() {
  std::vector<Spec> specs;
  for (int64_t i = 0; i < 700; ++i) specs.push_back({{1 + i % 5}});
  return specs;
}

// A tensor of the given layout holding `values` (a contiguous CPU tensor) on `device`.
Tensor make(const Shape& shape, Layout layout, const Tensor& values, Device device) {
  Tensor t;
  if (layout == Layout::ChannelsLast) {
    t = Tensor::empty(shape, DType::f32, device, MemoryFormat::ChannelsLast);
  } else if (layout == Layout::Gappy) {
    // Every element at twice its row-major offset: not dense.
    Shape strides(shape.size());
    int64_t stride = 2;
    for (size_t d = shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= std::max<int64_t>(shape[d], 1);
    }
    t = Tensor::empty_strided(shape, strides, DType::f32, device);
  } else {
    t = Tensor::empty(shape, DType::f32, device);
  }
  t.copy_(values);
  if (layout == Layout::ChannelsLast) REQUIRE(t.is_contiguous(MemoryFormat::ChannelsLast));
  if (layout == Layout::Gappy && t.numel() > 1) REQUIRE(!t.is_dense());
  return t;
}

// Parameter i gets a gradient at step s unless it never has one (i % 9 == 4) or its first
// one comes at step 1 (i % 7 == 2).
bool has_grad(size_t i, int step) { return i % 9 != 4 && !(i % 7 == 2 && step == 0); }

struct Outcome {
  std::vector<std::vector<float>> params;           // on the CPU, in parameter order
  std::map<std::string, std::vector<float>> state;  // state_dict entries by key
};

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Three steps of the optimizer over the specs' parameters. Parameter i lives on devices[i %
// devices.size()]; multi chooses the multi-tensor path (where the device has one).
Outcome run(const std::vector<Spec>& specs, const std::vector<Device>& devices,
            const MakeOptimizer& make_optimizer, bool multi) {
  std::vector<Tensor> params;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor init = random_tensor(specs[i].shape, 50 + i);
    params.push_back(make(specs[i].shape, specs[i].param, init, devices[i % devices.size()]));
    params.back().set_requires_grad(true);
  }
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(params);
  opt->set_multi_tensor(multi);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!has_grad(i, step)) {
        params[i].set_grad(Tensor());
        continue;
      }
      const Tensor g = random_tensor(specs[i].shape, 1000 * (step + 1) + i);
      params[i].set_grad(make(specs[i].shape, specs[i].grad, g, params[i].device()));
    }
    opt->step();
  }
  Outcome out;
  for (const Tensor& p : params) out.params.push_back(p.detach().to_float_vector());
  for (const auto& [key, t] : opt->state_dict()) out.state[key] = t.to_float_vector();
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// max |a - b| over max |a|, both taken over every element of the list: the parameters (or
// one kind of state) of all tensors together.
double list_relative_error(const std::vector<const std::vector<float>*>& a,
                           const std::vector<const std::vector<float>*>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 1e-6;
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t]->size() == b[t]->size());
    for (size_t i = 0; i < a[t]->size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs((*a[t])[i] - (*b[t])[i])));
      scale = std::max(scale, static_cast<double>(std::fabs((*a[t])[i])));
    }
  }
  return diff / scale;
}

void check_bitwise(const Outcome& multi, const Outcome& single) {
  REQUIRE(multi.params.size() == single.params.size());
  for (size_t i = 0; i < multi.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(bitwise_equal(multi.params[i], single.params[i]));
  }
  REQUIRE(multi.state.size() == single.state.size());
  for (const auto& [key, values] : multi.state) {
    INFO("state " << key);
    REQUIRE(single.state.count(key));
    CHECK(bitwise_equal(values, single.state.at(key)));
  }
}

void check_close(const Outcome& cpu, const Outcome& gpu, double tol) {
  std::map<std::string, std::pair<std::vector<const std::vector<float>*>,
                                  std::vector<const std::vector<float>*>>>
      lists;
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    lists["params"].first.push_back(&cpu.params[i]);
    lists["params"].second.push_back(&gpu.params[i]);
  }
  REQUIRE(cpu.state.size() == gpu.state.size());
  for (const auto& [key, values] : cpu.state) {
    REQUIRE(gpu.state.count(key));
    const std::string kind = key.substr(0, key.rfind('.'));
    lists[kind].first.push_back(&values);
    lists[kind].second.push_back(&gpu.state.at(key));
  }
  for (const auto& [kind, pair] : lists) {
    INFO(kind);
    CHECK(list_relative_error(pair.first, pair.second) <= tol);
  }
}

// Swaps a kernel slot's CUDA function for one that counts its calls, for the scope.
template <auto& Slot, class Sig = typename std::remove_cvref_t<decltype(Slot)>::Signature>
struct SlotCounter;
template <auto& Slot, class R, class... A>
struct SlotCounter<Slot, R(A...)> {
  static inline int calls = 0;
  static inline R (*original)(A...) = nullptr;
  static R counted(A... args) {
    ++calls;
    return original(args...);
  }
  SlotCounter() {
    original = Slot.get(kGpu);
    calls = 0;
    Slot.set(DeviceType::CUDA, &counted);
  }
  ~SlotCounter() { Slot.set(DeviceType::CUDA, original); }
  SlotCounter(const SlotCounter&) = delete;
  SlotCounter& operator=(const SlotCounter&) = delete;
};

struct Case {
  const char* name;
  MakeOptimizer make;
};

std::vector<Case> cases() {
  using optim::AdamW, optim::AdamWOptions, optim::RMSprop, optim::RMSpropOptions, optim::SGD,
      optim::SGDOptions;
  auto sgd = [](SGDOptions o) {
    return [o](std::vector<Tensor> p) { return std::make_unique<SGD>(std::move(p), o); };
  };
  auto rmsprop = [](RMSpropOptions o) {
    return [o](std::vector<Tensor> p) { return std::make_unique<RMSprop>(std::move(p), o); };
  };
  auto adamw = [](AdamWOptions o) {
    return [o](std::vector<Tensor> p) { return std::make_unique<AdamW>(std::move(p), o); };
  };
  return {
      {"SGD", sgd({.lr = 0.1})},
      {"SGD momentum", sgd({.lr = 0.1, .momentum = 0.9})},
      {"SGD momentum dampening weight decay",
       sgd({.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 1e-3})},
      {"SGD nesterov weight decay",
       sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true})},
      {"RMSprop", rmsprop({.lr = 0.01})},
      {"RMSprop centered", rmsprop({.lr = 0.01, .centered = true})},
      {"RMSprop momentum weight decay",
       rmsprop({.lr = 0.01, .weight_decay = 1e-2, .momentum = 0.9})},
      {"RMSprop centered momentum",
       rmsprop({.lr = 0.01, .alpha = 0.9, .momentum = 0.9, .centered = true})},
      {"AdamW", adamw({.lr = 0.01})},
      {"AdamW betas weight decay",
       adamw({.lr = 1e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1})},
  };
}

}  // namespace

TEST_CASE("multi-tensor optimizer steps equal the per-parameter CUDA kernels and match the CPU") {
  DPAR_REQUIRE_GPU();
  REQUIRE(kernels::sgd_step_multi.available(kGpu));
  REQUIRE(kernels::rmsprop_step_multi.available(kGpu));
  REQUIRE(kernels::adamw_step_multi.available(kGpu));
  const std::vector<Spec> specs = varied_specs();
  for (const Case& c : cases()) {
    INFO(c.name);
    const Outcome multi = run(specs, {kGpu}, c.make, true);
    const Outcome single = run(specs, {kGpu}, c.make, false);
    const Outcome cpu = run(specs, {Device::cpu()}, c.make, true);
    check_bitwise(multi, single);
    check_close(cpu, multi, 1e-6);
  }
}

TEST_CASE("a step over more parameters than one launch holds") {
  DPAR_REQUIRE_GPU();
  const std::vector<Spec> specs = many_small_specs();
  for (const Case& c : cases()) {
    INFO(c.name);
    const Outcome multi = run(specs, {kGpu}, c.make, true);
    check_bitwise(multi, run(specs, {kGpu}, c.make, false));
    check_close(run(specs, {Device::cpu()}, c.make, true), multi, 1e-6);
  }
}

TEST_CASE("the multi-tensor path calls its slot once per step and device") {
  DPAR_REQUIRE_GPU();
  const std::vector<Spec> specs = varied_specs();
  int updates = 0;  // parameter updates over the three steps
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < specs.size(); ++i) updates += has_grad(i, step) ? 1 : 0;
  }
  const MakeOptimizer adamw = [](std::vector<Tensor> p) {
    return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions{.lr = 0.01});
  };
  {
    SlotCounter<kernels::adamw_step_multi> multi;
    SlotCounter<kernels::adamw_step> single;
    run(specs, {kGpu}, adamw, true);
    CHECK(multi.calls == 3);
    CHECK(single.calls == 0);
    run(specs, {kGpu}, adamw, false);
    CHECK(multi.calls == 3);
    CHECK(single.calls == updates);
  }
  {
    // DPAR_OPTIM_MULTI_TENSOR=0 is the default of optimizers created while it is set.
    ::setenv("DPAR_OPTIM_MULTI_TENSOR", "0", 1);
    Tensor p = leaf_on(random_tensor({3}, 1), kGpu);
    optim::SGD off({p}, optim::SGDOptions{.lr = 0.1});
    ::unsetenv("DPAR_OPTIM_MULTI_TENSOR");
    optim::SGD on({p}, optim::SGDOptions{.lr = 0.1});
    CHECK(!off.multi_tensor());
    CHECK(on.multi_tensor());
    SlotCounter<kernels::sgd_step_multi> multi;
    SlotCounter<kernels::sgd_step> single;
    p.set_grad(random_tensor({3}, 2).to(kGpu));
    off.step();
    CHECK(multi.calls == 0);
    CHECK(single.calls == 1);
    on.step();
    CHECK(multi.calls == 1);
    CHECK(single.calls == 1);
  }
}

TEST_CASE("an optimizer over CPU and CUDA parameters updates each device its own way") {
  DPAR_REQUIRE_GPU();
  const std::vector<Spec> specs = varied_specs();
  const MakeOptimizer sgd = [](std::vector<Tensor> p) {
    return std::make_unique<optim::SGD>(
        std::move(p), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  };
  SlotCounter<kernels::sgd_step_multi> multi;
  const Outcome mixed = run(specs, {Device::cpu(), kGpu}, sgd, true);
  CHECK(multi.calls == 3);  // the CUDA half, once per step; the CPU half parameter by parameter
  check_bitwise(mixed, run(specs, {Device::cpu(), kGpu}, sgd, false));
  check_close(run(specs, {Device::cpu()}, sgd, true), mixed, 1e-6);
}
