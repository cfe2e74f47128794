// CPU kernels for pointwise unary ops, activations and dropout masks. Formulas (including the
// value at kinks and the order of float operations) follow PyTorch's CPU kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/activation_kernels.h"
#include "tensor/cpu/strided_loop.h"

namespace dpar::cpu {
namespace {

using kernels::UnaryOp;

template <UnaryOp Op>
inline float forward(float x) {
  if constexpr (Op == UnaryOp::exp) return std::exp(x);
  if constexpr (Op == UnaryOp::log) return std::log(x);
  if constexpr (Op == UnaryOp::sqrt) return std::sqrt(x);
  if constexpr (Op == UnaryOp::square) return x * x;
  // Written so that NaN propagates, as in PyTorch.
  if constexpr (Op == UnaryOp::relu) return x < 0.f ? 0.f : x;
  if constexpr (Op == UnaryOp::hardswish) return x * std::min(std::max(x + 3.f, 0.f), 6.f) / 6.f;
  if constexpr (Op == UnaryOp::hardsigmoid) return std::min(std::max(x + 3.f, 0.f), 6.f) / 6.f;
  if constexpr (Op == UnaryOp::sigmoid) return 1.f / (1.f + std::exp(-x));
}

// g: incoming gradient; s: the saved tensor (output or input, see unary_saves_output).
template <UnaryOp Op>
inline float backward(float g, float s) {
  if constexpr (Op == UnaryOp::exp) return g * s;
  if constexpr (Op == UnaryOp::log) return g / s;
  if constexpr (Op == UnaryOp::sqrt) return g / (2.f * s);
  if constexpr (Op == UnaryOp::square) return g * (2.f * s);
  // Gradient 0 where the output is 0 (so at x == 0 too).
  if constexpr (Op == UnaryOp::relu) return s <= 0.f ? 0.f : g;
  // PyTorch: 0 below -3, x/3 + 1/2 on [-3, 3], 1 above.
  // The middle piece is computed unconditionally so the loop vectorises (a division in one
  // branch only is not speculated).
  if constexpr (Op == UnaryOp::hardswish) {
    const float mid = g * (s / 3.f + 0.5f);
    return s < -3.f ? 0.f : (s <= 3.f ? mid : g);
  }
  // PyTorch: 1/6 strictly inside (-3, 3), 0 elsewhere (including the kinks).
  if constexpr (Op == UnaryOp::hardsigmoid) return s > -3.f && s < 3.f ? g * (1.f / 6.f) : 0.f;
  if constexpr (Op == UnaryOp::sigmoid) return g * (1.f - s) * s;
}

constexpr int64_t kParallelThreshold = 65536;

template <UnaryOp Op>
void unary_typed(const Tensor& x, Tensor& out) {
  const float* px = static_cast<const float*>(x.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  if (x.strides() == out.strides() && out.is_dense()) {
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) po[i] = forward<Op>(px[i]);
    return;
  }
  for_each_row<2>(
      out.shape(), {&out.strides(), &x.strides()},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        float* o = po + off[0];
        const float* xi = px + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = forward<Op>(xi[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * st[0]] = forward<Op>(xi[i * st[1]]);
        }
      });
}

template <UnaryOp Op>
void unary_backward_typed(const Tensor& grad, const Tensor& saved, Tensor& grad_in) {
  const float* pg = static_cast<const float*>(grad.raw_data());
  const float* ps = static_cast<const float*>(saved.raw_data());
  float* po = static_cast<float*>(grad_in.raw_data());
  if (grad.strides() == grad_in.strides() && saved.strides() == grad_in.strides() &&
      grad_in.is_dense()) {
    const int64_t n = grad_in.numel();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) po[i] = backward<Op>(pg[i], ps[i]);
    return;
  }
  for_each_row<3>(
      grad_in.shape(), {&grad_in.strides(), &grad.strides(), &saved.strides()},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        float* o = po + off[0];
        const float* g = pg + off[1];
        const float* s = ps + off[2];
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = backward<Op>(g[i], s[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * st[0]] = backward<Op>(g[i * st[1]], s[i * st[2]]);
        }
      });
}

// Calls fn(std::integral_constant<UnaryOp, op>) so kernels are instantiated per op.
template <class Fn>
void dispatch(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::exp:
      return fn(std::integral_constant<UnaryOp, UnaryOp::exp>{});
    case UnaryOp::log:
      return fn(std::integral_constant<UnaryOp, UnaryOp::log>{});
    case UnaryOp::sqrt:
      return fn(std::integral_constant<UnaryOp, UnaryOp::sqrt>{});
    case UnaryOp::square:
      return fn(std::integral_constant<UnaryOp, UnaryOp::square>{});
    case UnaryOp::relu:
      return fn(std::integral_constant<UnaryOp, UnaryOp::relu>{});
    case UnaryOp::hardswish:
      return fn(std::integral_constant<UnaryOp, UnaryOp::hardswish>{});
    case UnaryOp::hardsigmoid:
      return fn(std::integral_constant<UnaryOp, UnaryOp::hardsigmoid>{});
    case UnaryOp::sigmoid:
      return fn(std::integral_constant<UnaryOp, UnaryOp::sigmoid>{});
  }
}

void unary_cpu(UnaryOp op, const Tensor& x, Tensor& out) {
  dispatch(op, [&](auto tag) { unary_typed<decltype(tag)::value>(x, out); });
}

void unary_backward_cpu(UnaryOp op, const Tensor& grad, const Tensor& saved, Tensor& grad_in) {
  dispatch(op, [&](auto tag) { unary_backward_typed<decltype(tag)::value>(grad, saved, grad_in); });
}

// out = x * (mask * scale): a dropped NaN stays NaN, as with PyTorch's x * noise.
void masked_scale_cpu(const Tensor& x, const Tensor& mask, float scale, Tensor& out) {
  const float* px = static_cast<const float*>(x.raw_data());
  const uint8_t* pm = static_cast<const uint8_t*>(mask.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  if (x.strides() == out.strides() && mask.strides() == out.strides() && out.is_dense()) {
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) po[i] = px[i] * (static_cast<float>(pm[i]) * scale);
    return;
  }
  for_each_row<3>(
      out.shape(), {&out.strides(), &x.strides(), &mask.strides()},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        float* o = po + off[0];
        const float* xi = px + off[1];
        const uint8_t* m = pm + off[2];
        for (int64_t i = 0; i < n; ++i) {
          o[i * st[0]] = xi[i * st[1]] * (static_cast<float>(m[i * st[2]]) * scale);
        }
      });
}

}  // namespace

void register_unary_kernels() {
  kernels::unary.set(DeviceType::CPU, &unary_cpu);
  kernels::unary_backward.set(DeviceType::CPU, &unary_backward_cpu);
  kernels::masked_scale.set(DeviceType::CPU, &masked_scale_cpu);
}

}  // namespace dpar::cpu
