#pragma once
// Random inputs and tolerant comparisons of tensors, shared by the unit and GPU tests.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "dpar/dpar.h"

// Uniform values in [lo, hi) from a fixed seed, on the CPU.
inline dpar::Tensor random_tensor(const dpar::Shape& shape, uint64_t seed, float lo = -1.f,
                                  float hi = 1.f) {
  dpar::Generator gen(seed);
  std::vector<float> v(static_cast<size_t>(dpar::shape_numel(shape)));
  for (float& x : v) x = lo + (hi - lo) * gen.uniform();
  return dpar::Tensor::from_vector(v, shape);
}

// max |a - b| / max(max |a|, 1e-6) over all elements; a on any device, b on any device.
inline double relative_error(const dpar::Tensor& a, const dpar::Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  double diff = 0, scale = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(x[i] - y[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
  }
  return diff / scale;
}

// A leaf copy of t on `device` that requires grad.
inline dpar::Tensor leaf_on(const dpar::Tensor& t, dpar::Device device) {
  dpar::Tensor out = t.detach().to(device).clone();
  out.set_requires_grad(true);
  return out;
}
