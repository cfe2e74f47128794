#pragma once
// The per-element formulas of the unary ops, shared by the CPU kernels (tensor/cpu/
// unary_kernels.cpp) and the CUDA kernels (tensor/cuda/unary.cu), so both backends compute the
// same thing: PyTorch's CPU formulas, with NaN propagating and PyTorch's values at the kinks.
// Included by .cu files too, so C++17 and host/device-callable.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/activation_kernels.h"

#ifdef __CUDACC__
#define DPAR_HOST_DEVICE __host__ __device__ __forceinline__
#else
// Always inlined: the CPU's ISA clones (cpu/isa.h) must get these bodies in their own code.
#define DPAR_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace dpar::kernels {

// exp and erf for the CPU loops, written without libm calls so that GCC vectorises the loops
// that use them (glibc's vector expf needs -ffast-math, and erff has none): scalar erff/expf
// made GELU cost as much as the linear layers around it. On a GPU the device's expf / erff.
//
// fast_exp: Cody-Waite reduction x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts) and a
// degree-6 polynomial for e^r (the Cephes coefficients), scaled by 2^n through the exponent
// bits; within 2 ulp of expf on [-87, 88], where the input is clamped (NaN passes through).
// |r| <= ln2 / 2 holds for round-to-nearest n as for floor(. + 0.5).
DPAR_HOST_DEVICE float fast_exp(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  x = x > 88.3762626647949f ? 88.3762626647949f : x;
  x = x < -87.3365447504020f ? -87.3365447504020f : x;
  // Round to nearest by adding and removing 1.5 * 2^23 (the compiler keeps both steps without
  // -ffast-math): floorf is a libm call below SSE4.1, the baseline these kernels build for.
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = p * z + r + 1.f;
  // A NaN input leaves n NaN, whose conversion to int is undefined: convert 0 instead (e_r
  // already carries the NaN to the result). The select vectorises as a blend.
  const int32_t bits = (static_cast<int32_t>(n == n ? n : 0.f) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return e_r * scale;
#endif
}

// erf as a rational function of degree 13/8 on [-4, 4] (beyond which erf rounds to +-1 in
// f32): the interpolant of Eigen's generic_fast_erf_float, accurate to a couple of ulp. No exp
// and one division, so the vectorised loops (GELU above all) run about twice as fast as with
// the erfc-and-exp form. NaN passes through the clamp.
DPAR_HOST_DEVICE float fast_erf(float x) {
#ifdef __CUDA_ARCH__
  return erff(x);
#else
  x = x > 4.f ? 4.f : (x < -4.f ? -4.f : x);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return x * p / q;
#endif
}

// std::max/std::min exactly (not fmaxf/fminf, which drop a NaN operand): hardswish of NaN is
// NaN, as in PyTorch.
DPAR_HOST_DEVICE float max_keep_nan(float a, float b) { return a < b ? b : a; }
DPAR_HOST_DEVICE float min_keep_nan(float a, float b) { return b < a ? b : a; }

// The constants of the GELU forms, as PyTorch writes them.
constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;
constexpr float kSqrt2 = 1.41421356237309504880f;

template <UnaryOp Op>
DPAR_HOST_DEVICE float unary_value(float x, UnaryArgs args = {}) {
  if constexpr (Op == UnaryOp::exp) {
    return fast_exp(x);
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
  } else if constexpr (Op == UnaryOp::sigmoid) {
    return 1.f / (1.f + fast_exp(-x));
  } else if constexpr (Op == UnaryOp::tanh) {
    return tanhf(x);
  } else if constexpr (Op == UnaryOp::gelu) {
    return 0.5f * x * (1.f + fast_erf(x * kSqrt1_2));
  } else if constexpr (Op == UnaryOp::gelu_tanh) {
    return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + kGeluKappa * x * x * x)));
  } else if constexpr (Op == UnaryOp::silu) {
    return x / (1.f + fast_exp(-x));
  } else if constexpr (Op == UnaryOp::softplus) {
    // Linear above the threshold, where log1p(exp) would only round to x.
    return x * args.a > args.b ? x : log1pf(expf(x * args.a)) / args.a;
  } else if constexpr (Op == UnaryOp::leaky_relu) {
    return x > 0.f ? x : x * args.a;
  } else if constexpr (Op == UnaryOp::abs) {
    return fabsf(x);
  } else if constexpr (Op == UnaryOp::clamp) {
    // NaN stays NaN (PyTorch's clamp propagates it).
    return min_keep_nan(max_keep_nan(x, args.a), args.b);
  } else if constexpr (Op == UnaryOp::pow) {
    return powf(x, args.a);
  } else {
    static_assert(Op == UnaryOp::erf);
    return fast_erf(x);
  }
}

// g: incoming gradient; s: the saved tensor (output or input, see unary_saves_output).
template <UnaryOp Op>
DPAR_HOST_DEVICE float unary_grad(float g, float s, UnaryArgs args = {}) {
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
  } else if constexpr (Op == UnaryOp::sigmoid) {
    return g * (1.f - s) * s;
  } else if constexpr (Op == UnaryOp::tanh) {
    return g * (1.f - s * s);  // s is the output
  } else if constexpr (Op == UnaryOp::gelu) {
    const float cdf = 0.5f * (1.f + fast_erf(s * kSqrt1_2));
    const float pdf = kInvSqrt2Pi * fast_exp(-0.5f * s * s);
    return g * (cdf + s * pdf);
  } else if constexpr (Op == UnaryOp::gelu_tanh) {
    const float inner = kSqrt2OverPi * (s + kGeluKappa * s * s * s);
    const float t = tanhf(inner);
    const float left_derivative = 0.5f * (1.f + t);
    const float right_derivative =
        0.5f * s * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluKappa * s * s);
    return g * (left_derivative + right_derivative);
  } else if constexpr (Op == UnaryOp::silu) {
    const float sig = 1.f / (1.f + fast_exp(-s));
    return g * sig * (1.f + s * (1.f - sig));
  } else if constexpr (Op == UnaryOp::softplus) {
    const float z = expf(s * args.a);
    return s * args.a > args.b ? g : g * z / (z + 1.f);
  } else if constexpr (Op == UnaryOp::leaky_relu) {
    return s > 0.f ? g : g * args.a;
  } else if constexpr (Op == UnaryOp::abs) {
    return s > 0.f ? g : (s < 0.f ? -g : 0.f);  // sign(x) * g, 0 at 0
  } else if constexpr (Op == UnaryOp::clamp) {
    return s >= args.a && s <= args.b ? g : 0.f;  // PyTorch: passes at the bounds
  } else if constexpr (Op == UnaryOp::pow) {
    // exponent * x^(exponent - 1), and exactly 0 for exponent 0 (PyTorch's masked_fill).
    return args.a == 0.f ? 0.f : g * args.a * powf(s, args.a - 1.f);
  } else {
    static_assert(Op == UnaryOp::erf);
    return g * (2.f * kInvSqrt2Pi * kSqrt2) * fast_exp(-s * s);  // 2/sqrt(pi) e^(-x^2)
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
    case UnaryOp::tanh:
      return fn(std::integral_constant<UnaryOp, UnaryOp::tanh>{});
    case UnaryOp::gelu:
      return fn(std::integral_constant<UnaryOp, UnaryOp::gelu>{});
    case UnaryOp::gelu_tanh:
      return fn(std::integral_constant<UnaryOp, UnaryOp::gelu_tanh>{});
    case UnaryOp::silu:
      return fn(std::integral_constant<UnaryOp, UnaryOp::silu>{});
    case UnaryOp::softplus:
      return fn(std::integral_constant<UnaryOp, UnaryOp::softplus>{});
    case UnaryOp::leaky_relu:
      return fn(std::integral_constant<UnaryOp, UnaryOp::leaky_relu>{});
    case UnaryOp::abs:
      return fn(std::integral_constant<UnaryOp, UnaryOp::abs>{});
    case UnaryOp::clamp:
      return fn(std::integral_constant<UnaryOp, UnaryOp::clamp>{});
    case UnaryOp::pow:
      return fn(std::integral_constant<UnaryOp, UnaryOp::pow>{});
    case UnaryOp::erf:
      return fn(std::integral_constant<UnaryOp, UnaryOp::erf>{});
  }
}

}  // namespace dpar::kernels
