// CPU kernels for pointwise unary ops, activations and dropout masks. The per-element formulas
// (PyTorch's CPU ones) are shared with the CUDA kernels: tensor/unary_math.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/activation_kernels.h"
#include "tensor/cpu/column_sums.h"
#include "tensor/cpu/isa.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/unary_math.h"

namespace dpar::cpu {
namespace {

using kernels::UnaryOp;

constexpr int64_t kParallelThreshold = 65536;

// The dense loops, once per ISA (cpu/isa.h): GELU and the other exp/erf formulas are compute
// bound, and 16 lanes instead of 4 pay for themselves.
// clang-format off
#define DPAR_UNARY_FLAT_LOOPS(SUFFIX, TARGET)                                              \
  template <UnaryOp Op>                                                                   \
  TARGET void unary_flat##SUFFIX(const float* px, float* po, int64_t n,                   \
                                 kernels::UnaryArgs args) {                               \
    _Pragma("omp parallel for schedule(static) if (n > kParallelThreshold)")              \
    for (int64_t i = 0; i < n; ++i) po[i] = kernels::unary_value<Op>(px[i], args);        \
  }                                                                                       \
  template <UnaryOp Op>                                                                   \
  TARGET void unary_grad_flat##SUFFIX(const float* pg, const float* ps, float* po,        \
                                      int64_t n, kernels::UnaryArgs args) {               \
    _Pragma("omp parallel for schedule(static) if (n > kParallelThreshold)")              \
    for (int64_t i = 0; i < n; ++i) po[i] = kernels::unary_grad<Op>(pg[i], ps[i], args);  \
  }                                                                                       \
  /* Rows of cols floats: each gradient row, then its sum into acc (column_sum_block's */ \
  /* order: rows one after another, in double), while the row is in L1. */               \
  template <UnaryOp Op>                                                                   \
  TARGET void unary_grad_rows_summed##SUFFIX(const float* pg, const float* ps, float* po, \
                                             int64_t rows, int64_t cols, double* acc,     \
                                             kernels::UnaryArgs args) {                   \
    for (int64_t j = 0; j < cols; ++j) acc[j] = 0.0;                                      \
    for (int64_t i = 0; i < rows; ++i) {                                                  \
      const float* g = pg + i * cols;                                                     \
      const float* s = ps + i * cols;                                                     \
      float* o = po + i * cols;                                                           \
      for (int64_t j = 0; j < cols; ++j) o[j] = kernels::unary_grad<Op>(g[j], s[j], args); \
      for (int64_t j = 0; j < cols; ++j) acc[j] += static_cast<double>(o[j]);             \
    }                                                                                     \
  }
DPAR_UNARY_FLAT_LOOPS(_baseline, )
DPAR_UNARY_FLAT_LOOPS(_avx2, DPAR_TARGET_AVX2)
DPAR_UNARY_FLAT_LOOPS(_avx512, DPAR_TARGET_AVX512)
// clang-format on
#undef DPAR_UNARY_FLAT_LOOPS

template <UnaryOp Op>
void unary_flat(const float* px, float* po, int64_t n, kernels::UnaryArgs args) {
  switch (cpu_isa()) {
    case Isa::avx512:
      return unary_flat_avx512<Op>(px, po, n, args);
    case Isa::avx2:
      return unary_flat_avx2<Op>(px, po, n, args);
    case Isa::baseline:
      break;
  }
  unary_flat_baseline<Op>(px, po, n, args);
}

template <UnaryOp Op>
void unary_grad_flat(const float* pg, const float* ps, float* po, int64_t n,
                     kernels::UnaryArgs args) {
  switch (cpu_isa()) {
    case Isa::avx512:
      return unary_grad_flat_avx512<Op>(pg, ps, po, n, args);
    case Isa::avx2:
      return unary_grad_flat_avx2<Op>(pg, ps, po, n, args);
    case Isa::baseline:
      break;
  }
  unary_grad_flat_baseline<Op>(pg, ps, po, n, args);
}

template <UnaryOp Op>
void unary_grad_rows_summed(const float* pg, const float* ps, float* po, int64_t rows, int64_t cols,
                            double* acc, kernels::UnaryArgs args) {
  switch (cpu_isa()) {
    case Isa::avx512:
      return unary_grad_rows_summed_avx512<Op>(pg, ps, po, rows, cols, acc, args);
    case Isa::avx2:
      return unary_grad_rows_summed_avx2<Op>(pg, ps, po, rows, cols, acc, args);
    case Isa::baseline:
      break;
  }
  unary_grad_rows_summed_baseline<Op>(pg, ps, po, rows, cols, acc, args);
}

template <UnaryOp Op>
void unary_typed(const Tensor& x, Tensor& out, kernels::UnaryArgs args) {
  const float* px = static_cast<const float*>(x.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  if (x.strides() == out.strides() && out.is_dense()) {
    unary_flat<Op>(px, po, out.numel(), args);
    return;
  }
  for_each_row<2>(
      out.shape(), {&out.strides(), &x.strides()},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        float* o = po + off[0];
        const float* xi = px + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = kernels::unary_value<Op>(xi[i], args);
        } else {
          for (int64_t i = 0; i < n; ++i)
            o[i * st[0]] = kernels::unary_value<Op>(xi[i * st[1]], args);
        }
      });
}

template <UnaryOp Op>
void unary_backward_typed(const Tensor& grad, const Tensor& saved, Tensor& grad_in,
                          kernels::UnaryArgs args) {
  const float* pg = static_cast<const float*>(grad.raw_data());
  const float* ps = static_cast<const float*>(saved.raw_data());
  float* po = static_cast<float*>(grad_in.raw_data());
  if (grad.strides() == grad_in.strides() && saved.strides() == grad_in.strides() &&
      grad_in.is_dense()) {
    unary_grad_flat<Op>(pg, ps, po, grad_in.numel(), args);
    return;
  }
  for_each_row<3>(
      grad_in.shape(), {&grad_in.strides(), &grad.strides(), &saved.strides()},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        float* o = po + off[0];
        const float* g = pg + off[1];
        const float* s = ps + off[2];
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = kernels::unary_grad<Op>(g[i], s[i], args);
        } else {
          for (int64_t i = 0; i < n; ++i)
            o[i * st[0]] = kernels::unary_grad<Op>(g[i * st[1]], s[i * st[2]], args);
        }
      });
}

void unary_cpu(UnaryOp op, const Tensor& x, Tensor& out, kernels::UnaryArgs args) {
  kernels::dispatch_unary(op, [&](auto tag) { unary_typed<decltype(tag)::value>(x, out, args); });
}

void unary_backward_cpu(UnaryOp op, const Tensor& grad, const Tensor& saved, Tensor& grad_in,
                        kernels::UnaryArgs args) {
  kernels::dispatch_unary(op, [&](auto tag) {
    unary_backward_typed<decltype(tag)::value>(grad, saved, grad_in, args);
  });
}

void unary_backward_column_sums_cpu(UnaryOp op, const Tensor& grad, const Tensor& saved,
                                    Tensor& grad_in, Tensor& sums, kernels::UnaryArgs args) {
  const bool rows_of_memory = grad_in.dim() == 2 && grad.is_contiguous() && saved.is_contiguous() &&
                              grad_in.is_contiguous() && sums.is_contiguous();
  const int64_t rows = grad_in.dim() == 2 ? grad_in.size(0) : 0;
  const int64_t cols = grad_in.dim() == 2 ? grad_in.size(1) : 0;
  if (!rows_of_memory || rows == 0) {
    unary_backward_cpu(op, grad, saved, grad_in, args);
    if (grad_in.dim() == 2) {
      column_sums(static_cast<const float*>(grad_in.raw_data()), rows, cols, grad_in.stride(0),
                  sums.data<float>());
    }
    return;
  }
  const auto* pg = static_cast<const float*>(grad.raw_data());
  const auto* ps = static_cast<const float*>(saved.raw_data());
  auto* po = static_cast<float*>(grad_in.raw_data());
  const int64_t blocks = (rows + kColumnSumBlockRows - 1) / kColumnSumBlockRows;
  std::vector<double> partial(static_cast<size_t>(blocks * cols));
  kernels::dispatch_unary(op, [&](auto tag) {
    constexpr UnaryOp kOp = decltype(tag)::value;
#pragma omp parallel for schedule(static) if (blocks > 1 && rows * cols > kParallelThreshold)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t offset = b * kColumnSumBlockRows * cols;
      unary_grad_rows_summed<kOp>(pg + offset, ps + offset, po + offset,
                                  std::min(kColumnSumBlockRows, rows - b * kColumnSumBlockRows),
                                  cols, partial.data() + b * cols, args);
    }
  });
  add_block_sums(partial.data(), blocks, cols, sums.data<float>());
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
  kernels::unary_backward_column_sums.set(DeviceType::CPU, &unary_backward_column_sums_cpu);
  kernels::masked_scale.set(DeviceType::CPU, &masked_scale_cpu);
}

}  // namespace dpar::cpu
