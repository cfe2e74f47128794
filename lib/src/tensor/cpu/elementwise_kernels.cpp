// CPU kernels for binary arithmetic, scalar affine maps, in-place add and sum-reductions.
#include "tensor/elementwise_kernels.h"

#include <algorithm>
#include <vector>

#include "dpar/autograd/grad_mode.h"
#include "tensor/cpu/avx512_bf16.h"
#include "tensor/cpu/column_sums.h"
#include "tensor/cpu/elementwise_loops.h"
#include "tensor/cpu/float_types.h"
#include "tensor/cpu/isa.h"
#include "tensor/cpu/strided_loop.h"

namespace dpar::cpu {
namespace {

using kernels::BinaryOp;

template <BinaryOp Op>
void binary_op(const Tensor& a, const Tensor& b, Tensor& out) {
  visit_float_dtype(out.dtype(), "binary",
                    [&](auto tag) { binary_typed<Op, typename decltype(tag)::type>(a, b, out); });
}

// bf16 runs 16 lanes wide where the CPU has AVX-512 (avx512_bf16.h); the same loops otherwise.
bool wide_bf16(const Tensor& t) { return t.dtype() == DType::bf16 && cpu_isa() == Isa::avx512; }

void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  require_same_float("binary", out, a, "the first operand");
  require_same_float("binary", out, b, "the second operand");
  if (wide_bf16(out)) return avx512::binary_bf16(op, a, b, out);
  switch (op) {
    case BinaryOp::add:
      return binary_op<BinaryOp::add>(a, b, out);
    case BinaryOp::sub:
      return binary_op<BinaryOp::sub>(a, b, out);
    case BinaryOp::mul:
      return binary_op<BinaryOp::mul>(a, b, out);
    case BinaryOp::div:
      return binary_op<BinaryOp::div>(a, b, out);
  }
}

void affine_cpu(const Tensor& a, double alpha, double beta, Tensor& out) {
  require_same_float("affine", out, a, "the input");
  if (wide_bf16(out)) {
    return avx512::affine_bf16(a, static_cast<float>(alpha), static_cast<float>(beta), out);
  }
  visit_float_dtype(out.dtype(), "affine", [&](auto tag) {
    affine_typed<typename decltype(tag)::type>(a, static_cast<float>(alpha),
                                               static_cast<float>(beta), out);
  });
}

void add_inplace_cpu(Tensor& self, const Tensor& other, double alpha) {
  require_same_float("add_", self, other, "the added tensor");
  if (wide_bf16(self)) return avx512::add_inplace_bf16(self, other, static_cast<float>(alpha));
  visit_float_dtype(self.dtype(), "add_", [&](auto tag) {
    add_inplace_typed<typename decltype(tag)::type>(self, other, static_cast<float>(alpha));
  });
}

// Column sums of a row-major [rows, cols] block (rows ld floats apart) into acc (double), once
// per ISA: the loop over a row's columns vectorises, and acc stays in L1. Four rows go into
// each load and store of acc, added one after another as row by row would: the same sums,
// with a quarter of the traffic to acc.
// clang-format off
#define DPAR_COLUMN_SUM_BLOCK(SUFFIX, TARGET)                                             \
  TARGET void column_sum_block##SUFFIX(const float* x, int64_t rows, int64_t cols,       \
                                       int64_t ld, double* acc) {                        \
    for (int64_t j = 0; j < cols; ++j) acc[j] = 0.0;                                     \
    int64_t i = 0;                                                                       \
    for (; i + 4 <= rows; i += 4) {                                                      \
      const float* r0 = x + i * ld;                                                      \
      const float* r1 = r0 + ld;                                                         \
      const float* r2 = r1 + ld;                                                         \
      const float* r3 = r2 + ld;                                                         \
      for (int64_t j = 0; j < cols; ++j) {                                               \
        double a = acc[j];                                                               \
        a += static_cast<double>(r0[j]);                                                 \
        a += static_cast<double>(r1[j]);                                                 \
        a += static_cast<double>(r2[j]);                                                 \
        a += static_cast<double>(r3[j]);                                                 \
        acc[j] = a;                                                                      \
      }                                                                                  \
    }                                                                                    \
    for (; i < rows; ++i) {                                                              \
      const float* row = x + i * ld;                                                     \
      for (int64_t j = 0; j < cols; ++j) acc[j] += static_cast<double>(row[j]);          \
    }                                                                                    \
  }
DPAR_COLUMN_SUM_BLOCK(_baseline, )
DPAR_COLUMN_SUM_BLOCK(_avx512, DPAR_TARGET_AVX512)
// clang-format on
#undef DPAR_COLUMN_SUM_BLOCK

// The number of leading dims out sums over when it is x's shape with a prefix of dims set to
// 1 (and x and out are contiguous); -1 otherwise.
int64_t summed_prefix(const Tensor& x, const Tensor& out) {
  if (!x.is_contiguous() || !out.is_contiguous() || x.dim() != out.dim()) return -1;
  int64_t prefix = 0;
  while (prefix < x.dim() && out.size(prefix) == 1) ++prefix;
  for (int64_t d = prefix; d < x.dim(); ++d) {
    if (out.size(d) != x.size(d)) return -1;
  }
  return prefix;
}

// Sums x (f32 or bf16) into an f32 out (keepdim shape) by walking x in its own memory order;
// accumulates in double in a fixed order: deterministic.
template <class T>
void sum_to_strided(const Tensor& x, Tensor& out) {
  const Shape out_strides_bc = [&] {
    Shape s = contiguous_strides(out.shape());
    for (size_t d = 0; d < s.size(); ++d) {
      if (out.shape()[d] == 1 && x.shape()[d] != 1) s[d] = 0;
    }
    return s;
  }();
  std::vector<double> acc(static_cast<size_t>(out.numel()), 0.0);
  const T* px = data_as<const T>(x);
  // Operand 0 (x) leads the loop order.
  for_each_row<2>(
      x.shape(), {&x.strides(), &out_strides_bc},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        const T* xr = px + off[0];
        double* ar = acc.data() + off[1];
        if (st[1] == 0) {
          double s = 0;
          for (int64_t i = 0; i < n; ++i) s += to_float(xr[i * st[0]]);
          *ar += s;
        } else {
          for (int64_t i = 0; i < n; ++i) ar[i * st[1]] += to_float(xr[i * st[0]]);
        }
      });
  Tensor dense = out.is_contiguous() ? out : Tensor::empty(out.shape(), DType::f32, out.device());
  float* po = dense.data<float>();
  for (size_t i = 0; i < acc.size(); ++i) po[i] = static_cast<float>(acc[i]);
  if (!dense.is_same(out)) out.copy_(dense);
}

// Sums x into out (keepdim shape), deterministically. bf16 (autocast's activations) is summed
// as f32, into a result rounded once at the end.
void sum_to_cpu(const Tensor& x, Tensor& out) {
  if (out.dtype() != DType::f32) {
    NoGradGuard no_grad;
    Tensor sums = Tensor::empty(out.shape(), DType::f32);
    sum_to_cpu(x, sums);
    out.copy_(sums);
    return;
  }
  if (const int64_t prefix = summed_prefix(x, out); prefix > 0 && out.numel() > 1) {
    // Column sums of rows of memory (a bias gradient): f32 rows, so bf16 is widened first.
    NoGradGuard no_grad;
    const Tensor rows = x.dtype() == DType::f32 ? x : x.to(DType::f32);
    column_sums(static_cast<const float*>(rows.raw_data()), x.numel() / out.numel(), out.numel(),
                out.numel(), out.data<float>());
    return;
  }
  visit_float_dtype(x.dtype(), "sum_to",
                    [&](auto tag) { sum_to_strided<typename decltype(tag)::type>(x, out); });
}

// The per-image channel sums of a * b for channels-last a and b of [N, C, H, W] (the SE
// block's scale gradient, out [N, C, 1, 1]): one pass over both, where the product formed and
// summed apart wrote and read it again. Images run in parallel, each summed the same way on
// any thread count: rows in f32 over blocks of kRowsPerBlock, the blocks in double.
bool mul_sum_over_rows(const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.dim() != 4 || a.dtype() != DType::f32 || b.dtype() != DType::f32 ||
      out.dtype() != DType::f32 || a.strides() != b.strides() ||
      !a.is_contiguous(MemoryFormat::ChannelsLast) || !out.is_contiguous() ||
      out.shape() != Shape{a.size(0), a.size(1), 1, 1}) {
    return false;
  }
  constexpr int64_t kRowsPerBlock = 64;
  const int64_t N = a.size(0), C = a.size(1), rows = a.size(2) * a.size(3);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
#pragma omp parallel for schedule(static) if (N > 1 && a.numel() > 65536)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> total(static_cast<size_t>(C), 0.0);
    std::vector<float> block(static_cast<size_t>(C));
    float* __restrict part = block.data();
    for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerBlock) {
      std::fill(block.begin(), block.end(), 0.f);
      for (int64_t r = r0; r < std::min(rows, r0 + kRowsPerBlock); ++r) {
        const float* __restrict ar = pa + (n * rows + r) * C;
        const float* __restrict br = pb + (n * rows + r) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) part[c] += ar[c] * br[c];
      }
      for (int64_t c = 0; c < C; ++c) total[static_cast<size_t>(c)] += part[c];
    }
    for (int64_t c = 0; c < C; ++c)
      po[n * C + c] = static_cast<float>(total[static_cast<size_t>(c)]);
  }
  return true;
}

void mul_sum_to_cpu(const Tensor& a, const Tensor& b, Tensor& out) {
  if (mul_sum_over_rows(a, b, out)) return;
  NoGradGuard no_grad;
  Tensor product = Tensor::empty_like(a);
  binary_cpu(BinaryOp::mul, a, b, product);
  sum_to_cpu(product, out);
}

}  // namespace

void column_sum_block(const float* x, int64_t rows, int64_t cols, int64_t ld, double* acc) {
  if (cpu_isa() == Isa::avx512) return column_sum_block_avx512(x, rows, cols, ld, acc);
  column_sum_block_baseline(x, rows, cols, ld, acc);
}

void add_block_sums(double* partial, int64_t blocks, int64_t cols, float* out) {
  for (int64_t b = 1; b < blocks; ++b) {
    const double* acc = partial + b * cols;
    for (int64_t j = 0; j < cols; ++j) partial[j] += acc[j];
  }
  for (int64_t j = 0; j < cols; ++j) out[j] = static_cast<float>(partial[j]);
}

// Fixed blocks of rows are summed in parallel and the block sums added in block order, so the
// result does not depend on the thread count.
void column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
  // At least one block, zero when there are no rows.
  const int64_t blocks =
      std::max<int64_t>(1, (rows + kColumnSumBlockRows - 1) / kColumnSumBlockRows);
  std::vector<double> partial(static_cast<size_t>(blocks * cols));
#pragma omp parallel for schedule(static) if (blocks > 1 && rows * cols > 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    column_sum_block(x + b * kColumnSumBlockRows * ld,
                     std::min(kColumnSumBlockRows, rows - b * kColumnSumBlockRows), cols, ld,
                     partial.data() + b * cols);
  }
  add_block_sums(partial.data(), blocks, cols, out);
}

void register_elementwise_kernels() {
  kernels::binary.set(DeviceType::CPU, &binary_cpu);
  kernels::affine.set(DeviceType::CPU, &affine_cpu);
  kernels::add_inplace.set(DeviceType::CPU, &add_inplace_cpu);
  kernels::sum_to.set(DeviceType::CPU, &sum_to_cpu);
  kernels::mul_sum_to.set(DeviceType::CPU, &mul_sum_to_cpu);
}

}  // namespace dpar::cpu
