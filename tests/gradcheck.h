#pragma once
// Finite-difference gradient check for differentiable ops. The op is reduced to a scalar by a
// fixed random weighting of its output, so every output element contributes; central
// differences in double-checked float arithmetic are compared with autograd's gradients.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "dpar/dpar.h"

namespace dpar::testing {

struct GradcheckOptions {
  double eps = 1e-2;  // f32 ops: a larger step keeps rounding noise below the tolerance
  double atol = 2e-3;
  double rtol = 2e-2;
  // Inputs (by index) whose gradients are checked; empty = all that require grad.
  std::vector<size_t> check_inputs;
};

// A random f32 tensor with values in [lo, hi), drawn from gen; optionally channels-last.
inline Tensor random_tensor(const Shape& shape, Generator& gen, float lo = -1.f, float hi = 1.f,
                            MemoryFormat format = MemoryFormat::Contiguous) {
  Tensor t = Tensor::empty(shape, DType::f32, Device::cpu(), format);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (float& x : v) x = lo + (hi - lo) * gen.uniform();
  t.copy_(Tensor::from_vector(v, shape));
  return t;
}

// Distinct values 0.1 apart (offset by lo) in a random order from seed: a finite-difference
// step never changes which of them is largest (max/min reductions, max pooling).
inline Tensor distinct_values(const Shape& shape, uint64_t seed, float lo = -1.f,
                              MemoryFormat format = MemoryFormat::Contiguous) {
  const auto order = data::random_permutation(static_cast<size_t>(shape_numel(shape)), seed);
  std::vector<float> v;
  for (size_t k : order) v.push_back(0.1f * static_cast<float>(k) + lo);
  Tensor t = Tensor::empty(shape, DType::f32, Device::cpu(), format);
  t.copy_(Tensor::from_vector(v, shape));
  return t;
}

// Checks d(sum(w * f(inputs)))/d(inputs) against central differences.
inline void gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      std::vector<Tensor> inputs, const GradcheckOptions& opt = {}) {
  Generator gen(1234);
  Tensor out0;
  {
    NoGradGuard no_grad;
    out0 = f(inputs);
  }
  const Tensor weights = random_tensor(out0.shape(), gen, 0.5f, 1.5f);
  auto objective = [&](const std::vector<Tensor>& in) { return sum(mul(f(in), weights)); };

  for (Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) t.set_grad(Tensor());
  }
  objective(inputs).backward();

  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    if (!opt.check_inputs.empty() &&
        std::find(opt.check_inputs.begin(), opt.check_inputs.end(), i) == opt.check_inputs.end()) {
      continue;
    }
    INFO("input " << i << " " << x.str());
    const Tensor analytic = x.grad();
    REQUIRE(analytic.defined());
    REQUIRE(analytic.shape() == x.shape());
    const std::vector<float> ga = analytic.to_float_vector();
    // Perturb through a contiguous float copy, writing back into x's own layout.
    std::vector<float> base = x.to_float_vector();
    NoGradGuard no_grad;
    for (size_t k = 0; k < base.size(); ++k) {
      auto eval = [&](double delta) {
        std::vector<float> v = base;
        v[k] = static_cast<float>(v[k] + delta);
        x.copy_(Tensor::from_vector(v, x.shape()));
        return objective(inputs).item();
      };
      const double plus = eval(opt.eps), minus = eval(-opt.eps);
      const double numeric = (plus - minus) / (2 * opt.eps);
      INFO("element " << k << ": analytic " << ga[k] << " numeric " << numeric);
      CHECK(std::abs(ga[k] - numeric) <= opt.atol + opt.rtol * std::abs(numeric));
    }
    x.copy_(Tensor::from_vector(base, x.shape()));
  }
}

// Largest |a-b| / max(|b|, floor) over elements (floor avoids dividing by ~0).
inline double max_rel_error(const std::vector<float>& a, const std::vector<float>& b,
                            double floor = 1e-3) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double denom = std::max(std::abs(static_cast<double>(b[i])), floor);
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / denom);
  }
  return worst;
}

}  // namespace dpar::testing
