#pragma once
// The elementwise loops of binary arithmetic, scalar affine maps and in-place adds, templated on
// the storage type (float, or BF16 for amp::Autocast's activations, computed in f32 with one
// rounding at the store). In an unnamed namespace: elementwise_kernels.cpp includes this for the
// x86-64 baseline and avx512_bf16_kernels.cpp for AVX-512 (bf16 on a CPU that has it), each
// with copies of its own that the linker must not merge.
#include "tensor/cpu/float_types.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/elementwise_kernels.h"

namespace dpar::cpu {
namespace {

using kernels::BinaryOp;

// Below this many elements a loop runs on the calling thread alone.
constexpr int64_t kMinParallelElements = 65536;

template <BinaryOp Op>
inline float apply(float x, float y) {
  if constexpr (Op == BinaryOp::add) return x + y;
  if constexpr (Op == BinaryOp::sub) return x - y;
  if constexpr (Op == BinaryOp::mul) return x * y;
  if constexpr (Op == BinaryOp::div) return x / y;
}

template <BinaryOp Op, class T>
void binary_typed(const Tensor& a, const Tensor& b, Tensor& out) {
  const T* pa = data_as<const T>(a);
  const T* pb = data_as<const T>(b);
  T* po = data_as<T>(out);
  auto f = [](T x, T y) { return from_float<T>(apply<Op>(to_float(x), to_float(y))); };
  // Flat fast path: all three share one dense layout.
  if (a.strides() == out.strides() && b.strides() == out.strides() && out.is_dense()) {
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > kMinParallelElements)
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    return;
  }
  for_each_row_parallel<3>(
      out.shape(), {&out.strides(), &a.strides(), &b.strides()}, kMinParallelElements,
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        T* o = po + off[0];
        const T* x = pa + off[1];
        const T* y = pb + off[2];
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
          const T yv = *y;
          for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
        } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
          const T xv = *x;
          for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]]);
        }
      });
}

template <class T>
void affine_typed(const Tensor& a, float al, float be, Tensor& out) {
  const T* pa = data_as<const T>(a);
  T* po = data_as<T>(out);
  if (a.strides() == out.strides() && out.is_dense()) {
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > kMinParallelElements)
    for (int64_t i = 0; i < n; ++i) po[i] = from_float<T>(to_float(pa[i]) * al + be);
    return;
  }
  for_each_row_parallel<2>(
      out.shape(), {&out.strides(), &a.strides()}, kMinParallelElements,
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        for (int64_t i = 0; i < n; ++i) {
          po[off[0] + i * st[0]] = from_float<T>(to_float(pa[off[1] + i * st[1]]) * al + be);
        }
      });
}

template <class T>
void add_inplace_typed(Tensor& self, const Tensor& other, float al) {
  T* ps = data_as<T>(self);
  const T* po = data_as<const T>(other);
  auto f = [al](T s, T o) { return from_float<T>(to_float(s) + al * to_float(o)); };
  if (self.strides() == other.strides() && self.is_dense()) {
    const int64_t n = self.numel();
#pragma omp parallel for schedule(static) if (n > kMinParallelElements)
    for (int64_t i = 0; i < n; ++i) ps[i] = f(ps[i], po[i]);
    return;
  }
  for_each_row_parallel<2>(
      self.shape(), {&self.strides(), &other.strides()}, kMinParallelElements,
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        for (int64_t i = 0; i < n; ++i) {
          T& s = ps[off[0] + i * st[0]];
          s = f(s, po[off[1] + i * st[1]]);
        }
      });
}

}  // namespace
}  // namespace dpar::cpu
