#pragma once
// The per-element formulas of the unary ops, shared by the CPU kernels (tensor/cpu/
// unary_kernels.cpp) and the CUDA kernels (tensor/cuda/unary.cu), so both backends compute the
// same thing: PyTorch's CPU formulas, with NaN propagating and PyTorch's values at the kinks.
// Included by .cu files too, so C++17 and host/device-callable.
#include <cmath>
#include <type_traits>

#include "tensor/activation_kernels.h"

#ifdef __CUDACC__
#define DPAR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DPAR_HOST_DEVICE inline
#endif

namespace dpar::kernels {

// std::max/std::min exactly (not fmaxf/fminf, which drop a NaN operand): hardswish of NaN is
// NaN, as in PyTorch.
DPAR_HOST_DEVICE float max_keep_nan(float a, float b) { return a < b ? b : a; }
DPAR_HOST_DEVICE float min_keep_nan(float a, float b) { return b < a ? b : a; }

template <UnaryOp Op>
DPAR_HOST_DEVICE float unary_value(float x) {
  if constexpr (Op == UnaryOp::exp) {
    return expf(x);
  } else if constexpr (Op == UnaryOp::log) {
    return logf(x);
  } else if constexpr (Op == UnaryOp::sqrt) {
    return sqrtf(x);
  } else if constexpr (Op == UnaryOp::square) {
    return x * x;
  } else if constexpr (Op == UnaryOp::relu) {
    return x < 0.f ? 0.f : x;
  } else if constexpr (Op == UnaryOp::hardswish) {
    return x * min_keep_nan(max_keep_nan(x + 3.f, 0.f), 6.f) / 6.f;
  } else if constexpr (Op == UnaryOp::hardsigmoid) {
    return min_keep_nan(max_keep_nan(x + 3.f, 0.f), 6.f) / 6.f;
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    return 1.f / (1.f + expf(-x));
  }
}

// g: incoming gradient; s: the saved tensor (output or input, see unary_saves_output).
template <UnaryOp Op>
DPAR_HOST_DEVICE float unary_grad(float g, float s) {
  if constexpr (Op == UnaryOp::exp) {
    return g * s;
  } else if constexpr (Op == UnaryOp::log) {
    return g / s;
  } else if constexpr (Op == UnaryOp::sqrt) {
    return g / (2.f * s);
  } else if constexpr (Op == UnaryOp::square) {
    return g * (2.f * s);
  } else if constexpr (Op == UnaryOp::relu) {
    return s <= 0.f ? 0.f : g;  // 0 where the output is 0, so at x == 0 too
  } else if constexpr (Op == UnaryOp::hardswish) {
    // 0 below -3, x/3 + 1/2 on [-3, 3] (kinks included), 1 above. The middle piece is computed
    // unconditionally so the CPU loop vectorises (a division in one branch is not speculated).
    const float mid = g * (s / 3.f + 0.5f);
    return s < -3.f ? 0.f : (s <= 3.f ? mid : g);
  } else if constexpr (Op == UnaryOp::hardsigmoid) {
    return s > -3.f && s < 3.f ? g * (1.f / 6.f) : 0.f;  // 1/6 strictly inside (-3, 3)
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    return g * (1.f - s) * s;
  }
}

// Calls fn(std::integral_constant<UnaryOp, op>), so kernels are instantiated once per op.
template <class Fn>
void dispatch_unary(UnaryOp op, Fn&& fn) {
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

}  // namespace dpar::kernels
