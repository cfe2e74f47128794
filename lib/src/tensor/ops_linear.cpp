// matmul (2-D, batched with broadcasting, vectors) and linear (y = x W^T + b on [..., in]), on
// the gemm kernel slot.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
#include "tensor/broadcast.h"
#include "tensor/elementwise_kernels.h"
#include "tensor/linear_kernels.h"
#include "tensor/nn_kernels.h"
#include "tensor/zero_rows.h"

namespace dpar {
namespace {

void check_matrix(const Tensor& t, const char* op, const char* which) {
  DPAR_CHECK(t.defined(), op, ": ", which, " is undefined");
  DPAR_CHECK(detail::elementwise_dtype_ok(t), op, ": ", which,
             " must be f32 (or f16/bf16 on CUDA, bf16 on the CPU), got ", t.str(), " on ",
             t.device());
  DPAR_CHECK(t.dim() == 2, op, ": ", which, " must be 2-D, got shape ", t.shape());
}

// The dtype a product computed in `compute` writes when the caller wants `out`: oneDNN (CPU)
// writes an f32 result from bf16 operands directly; cuBLAS's result is in the compute dtype.
DType product_dtype(Device device, DType compute, DType out) {
  return device.is_cpu() ? out : compute;
}

// op(a) * op(b) (+ bias) into a new contiguous matrix of dtype `out`, computed in `compute`
// (f16/bf16 under autocast: the operands are cast, cuBLAS and oneDNN accumulate in f32; the CPU
// adds an f32 bias).
Tensor gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
            DType compute, DType out = DType::f32) {
  const int64_t m = trans_a ? a.size(1) : a.size(0);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  const Device device = a.device();
  Tensor c = Tensor::empty({m, n}, product_dtype(device, compute, out), device);
  kernels::gemm.get(device)(
      detail::cast_for_compute(a, compute), trans_a, detail::cast_for_compute(b, compute), trans_b,
      detail::cast_for_compute(bias, device.is_cpu() ? DType::f32 : compute), c);
  return detail::cast_for_compute(c, out);
}

// The stacked matrix products of a [..., M, K] and b [..., K, N] already expanded to one batch
// shape: c[i] = op(a[i]) op(b[i]) for every batch index i, into a new contiguous tensor.
Tensor batched_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, DType compute,
                    DType out = DType::f32) {
  const Shape batch(a.shape().begin(), a.shape().end() - 2);
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  const Tensor ac = detail::cast_for_compute(a, compute);
  const Tensor bc = detail::cast_for_compute(b, compute);
  Tensor c = Tensor::empty(out_shape, product_dtype(a.device(), compute, out), a.device());
  const int64_t count = shape_numel(batch);
  std::vector<int64_t> index(batch.size(), 0);
  auto matrix = [&](const Tensor& t, const std::vector<int64_t>& idx) {
    int64_t offset = t.storage_offset();
    for (size_t k = 0; k < idx.size(); ++k) offset += idx[k] * t.stride(static_cast<int64_t>(k));
    return Tensor::from_storage(t.storage(), offset, {t.size(-2), t.size(-1)},
                                {t.stride(-2), t.stride(-1)}, t.dtype());
  };
  const Tensor none;
  for (int64_t i = 0; i < count; ++i) {
    Tensor ci = matrix(c, index);
    kernels::gemm.get(a.device())(matrix(ac, index), trans_a, matrix(bc, index), trans_b, none, ci);
    for (int64_t k = static_cast<int64_t>(index.size()) - 1; k >= 0; --k) {
      if (++index[static_cast<size_t>(k)] < batch[static_cast<size_t>(k)]) break;
      index[static_cast<size_t>(k)] = 0;
    }
  }
  return detail::cast_for_compute(c, out);
}

// a [..., M, K] x b [..., K, N] with the batch dims broadcast (both at least 2-D).
Tensor matmul_batched(const Tensor& a, const Tensor& b) {
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2);
  const Shape batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch = detail::broadcast_shapes(batch_a, batch_b, "matmul");
  auto expanded = [&](const Tensor& t) {
    Shape shape = batch;
    shape.push_back(t.size(-2));
    shape.push_back(t.size(-1));
    return detail::expand_to(t, shape);
  };
  const Tensor ae = expanded(a), be = expanded(b);
  const DType compute = detail::autocast_compute_dtype(a.device());
  Tensor out = batched_gemm(ae, false, be, false, compute, detail::autocast_output_dtype(compute));
  if (autograd::needs_grad({a, b})) {
    autograd::record("matmul", {a, b}, {out},
                     [ae = ae.detach(), be = be.detach(), sa = a.shape(), sb = b.shape(), compute](
                         const autograd::GradList& g, const autograd::NeedsGrad& need) {
                       // dA = G B^T and dB = A^T G per batch, summed over the dims each operand was
                       // broadcast along.
                       autograd::GradList grads(2);
                       if (need[0])
                         grads[0] = detail::sum_to_shape(
                             batched_gemm(g[0], false, be, true, compute, ae.dtype()), sa);
                       if (need[1])
                         grads[1] = detail::sum_to_shape(
                             batched_gemm(ae, true, g[0], false, compute, be.dtype()), sb);
                       return grads;
                     });
  }
  return out;
}

Tensor matmul_2d(const Tensor& a, const Tensor& b) {
  check_matrix(a, "matmul", "first operand");
  check_matrix(b, "matmul", "second operand");
  DPAR_CHECK(a.size(1) == b.size(0), "matmul: inner dimensions differ: ", a.shape(), " x ",
             b.shape());
  DPAR_CHECK(a.device() == b.device(), "matmul: operands on different devices (", a.device(),
             " and ", b.device(), ")");
  const DType compute = detail::autocast_compute_dtype(a.device());
  Tensor out = gemm(a, false, b, false, {}, compute, detail::autocast_output_dtype(compute));
  if (autograd::needs_grad({a, b})) {
    autograd::record(
        "matmul", {a, b}, {out},
        [ad = a.detach(), bd = b.detach(), compute](const autograd::GradList& g,
                                                    const autograd::NeedsGrad& need) {
          // dA = G B^T, dB = A^T G
          return autograd::GradList{
              need[0] ? gemm(g[0], false, bd, true, {}, compute, ad.dtype()) : Tensor(),
              need[1] ? gemm(ad, true, g[0], false, {}, compute, bd.dtype()) : Tensor()};
        });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  DPAR_PROFILE_SCOPE("matmul");
  DPAR_CHECK(a_in.defined() && b_in.defined(), "matmul: an operand is undefined");
  // Outside autocast, f16/bf16 CUDA operands are multiplied in f32.
  const bool autocast = detail::autocast_compute_dtype(a_in.device()) != DType::f32;
  const Tensor a = autocast ? a_in : detail::f32_from_half(a_in);
  const Tensor b = autocast ? b_in : detail::f32_from_half(b_in);
  DPAR_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must be at least 1-D, got ", a.shape(),
             " and ", b.shape());
  DPAR_CHECK(detail::elementwise_dtype_ok(a) && detail::elementwise_dtype_ok(b),
             "matmul: operands must be f32 (or f16/bf16 on CUDA, bf16 on the CPU), got ", a.str(),
             " and ", b.str());
  DPAR_CHECK(a.device() == b.device(), "matmul: operands on different devices (", a.device(),
             " and ", b.device(), ")");
  // torch.matmul's rules: a 1-D operand is a row (first) or a column (second) vector whose
  // extra dim is dropped from the result.
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  DPAR_CHECK(a.size(-1) == b.size(-2), "matmul: inner dimensions differ: ", a.shape(), " x ",
             b.shape());
  if (a.dim() == 2 && b.dim() == 2) return matmul_2d(a, b);
  if (b.dim() == 2) {
    // [..., M, K] x [K, N]: one product of [prod(...) * M, K] x [K, N].
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(b.size(1));
    return matmul_2d(a.reshape({a.numel() / a.size(-1), a.size(-1)}), b).reshape(out_shape);
  }
  return matmul_batched(a, b);
}

namespace {

// The rows of g (2-D, f32, on the CPU, rows of memory) that hold a nonzero element, when they
// are at most half of them; nothing otherwise. A dense gradient is usually told by sixteen
// sampled rows, each read up to its first nonzero group of 16 floats, so it costs next to
// nothing where it finds nothing.
std::optional<std::vector<int64_t>> sparse_rows(const Tensor& g) {
  if (!g.device().is_cpu() || g.dtype() != DType::f32 || g.dim() != 2 || g.stride(1) != 1) {
    return std::nullopt;
  }
  const int64_t m = g.size(0), n = g.size(1), ld = g.stride(0);
  if (m < 2 || n == 0) return std::nullopt;
  const auto* data = g.data<float>();
  // A quick look first: sixteen rows spread over g. Where at least twelve of them hold a
  // nonzero element, g is taken as dense without reading the rest (only a missed saving, never
  // a wrong result, if its zero rows happened to sit elsewhere).
  constexpr int64_t kProbes = 16;
  if (m >= 4 * kProbes) {
    int64_t nonzero = 0;
    for (int64_t p = 0; p < kProbes; ++p)
      nonzero += !detail::row_is_zero(data + (p * m / kProbes) * ld, n);
    if (nonzero >= 12) return std::nullopt;
  }
  std::vector<int64_t> rows;
  if (!detail::few_nonzero_rows(data, m, n, ld, rows)) return std::nullopt;
  return rows;
}

// linear_backward for a G whose nonzero rows are only `rows` (a classifier that reads one token
// of a sequence model, e.g. ViT's class token: after its last block every other token's
// gradient is exactly zero, through the final norm, the MLP and the attention's projection).
// Only those rows enter the products: dW = G_r^T X_r, db = the column sums of G_r, and dX is
// zero but for rows r = G_r W. The same sums as the full products (rounded in another order):
// each term a zero row leaves out is an exact zero, unless that row of X, or W, holds an inf
// or a NaN, which the full product would turn into a NaN. On ViT-Tiny's training step (one
// core) these are the last block's MLP and attention projection: 64 of 4160 rows.
autograd::GradList linear_backward_rows(const Tensor& g, const Tensor& x, const Tensor& w,
                                        const autograd::NeedsGrad& need,
                                        const std::vector<int64_t>& rows) {
  Tensor gx, gw, gb;
  const Tensor index = Tensor::from_vector(rows, {static_cast<int64_t>(rows.size())});
  const Tensor g_rows = index_select(g, 0, index);
  if (need[1]) gw = gemm(g_rows, true, index_select(x, 0, index), false, {}, DType::f32);
  if (need[2]) {
    gb = Tensor::empty({g.size(1)}, DType::f32, g.device());
    Tensor sums = gb.view({1, g.size(1)});
    kernels::sum_to.get(g.device())(g_rows, sums);
  }
  if (need[0]) {
    gx = Tensor::zeros({g.size(0), w.size(1)}, DType::f32, g.device());
    const Tensor dx_rows = gemm(g_rows, false, w, false, {}, DType::f32);
    const int64_t n = w.size(1);
    const float* from = dx_rows.data<float>();
    float* to = gx.data<float>();
    for (const int64_t r : rows) {
      std::copy_n(from, n, to + r * n);
      from += n;
    }
  }
  return autograd::GradList{gx, gw, gb};
}

// The gradients of y = x W^T + b from G = dL/dy, in need's order (x, W, b). w is read for dX
// alone, and is undefined where x needs no gradient.
autograd::GradList linear_backward(const Tensor& g, const Tensor& x, const Tensor& w,
                                   const autograd::NeedsGrad& need, DType compute) {
  if (compute == DType::f32) {
    if (const auto rows = sparse_rows(g)) return linear_backward_rows(g, x, w, need, *rows);
  }
  Tensor gx, gw, gb;
  // The weight gradient first: G is still in cache from the node before, and dX, which the
  // next node reads, is then written last.
  if (need[1]) gw = gemm(g, true, x, false, {}, compute);  // G^T X
  if (need[2]) gb = Tensor::empty({g.size(1)}, DType::f32, g.device());
  if (need[0] && compute == DType::f32 && kernels::linear_input_grad.available(g.device())) {
    // dX = G W, with the bias gradient summed from G's blocks as the product reads them.
    gx = Tensor::empty({g.size(0), w.size(1)}, DType::f32, g.device());
    kernels::linear_input_grad.get(g.device())(g, w, gx, gb);
    return autograd::GradList{gx, gw, gb};
  }
  if (need[2]) {
    // Column sums of G, accumulated in a fixed order (deterministic).
    Tensor sums = gb.view({1, g.size(1)});
    kernels::sum_to.get(g.device())(g, sums);
  }
  if (need[0]) gx = gemm(g, false, w, false, {}, compute, x.dtype());  // G W
  return autograd::GradList{gx, gw, gb};
}

// linear's checks of a 2-D input, its weight and bias; `op` names the caller in errors.
void check_linear_operands(const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const char* op) {
  check_matrix(x, op, "input");
  check_matrix(weight, op, "weight");
  DPAR_CHECK(x.size(1) == weight.size(1), op, ": input ", x.shape(), " has ", x.size(1),
             " features but weight ", weight.shape(), " expects ", weight.size(1));
  DPAR_CHECK(x.device() == weight.device(), op, ": input on ", x.device(), " but weight on ",
             weight.device());
  if (bias.defined()) {
    DPAR_CHECK(bias.dtype() == DType::f32, op, ": bias must be f32, got ", bias.str());
    DPAR_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias shape ", bias.shape(),
               " does not match weight ", weight.shape(), " (expected [", weight.size(0), "])");
    DPAR_CHECK(bias.device() == x.device(), op, ": input on ", x.device(), " but bias on ",
               bias.device());
  }
}

// An x of [..., in] as the 2-D [rows, in] the products take, or x itself (checked later).
Tensor as_rows(const Tensor& x, const Tensor& weight, const char* op) {
  if (x.dim() == 2 || x.dim() < 1) return x;
  DPAR_CHECK(weight.defined() && weight.dim() == 2, op, ": weight must be 2-D [out, in], got ",
             weight.defined() ? weight.shape() : Shape{});
  return x.reshape({x.numel() / std::max<int64_t>(1, x.size(-1)), x.size(-1)});
}

// The shape of [..., in] x's result with `out` features.
Shape with_features(const Tensor& x, int64_t out) {
  Shape shape(x.shape().begin(), x.shape().end() - 1);
  shape.push_back(out);
  return shape;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DPAR_PROFILE_SCOPE("linear");
  DPAR_CHECK(x.defined(), "linear: input is undefined");
  if (x.dim() != 2 && x.dim() >= 1) {
    // [..., in] -> [..., out] through one 2-D product over the flattened leading dims.
    const Tensor rows = as_rows(x, weight, "linear");
    return linear(rows, weight, bias).reshape(with_features(x, weight.size(0)));
  }
  check_linear_operands(x, weight, bias, "linear");
  const DType compute = detail::autocast_compute_dtype(x.device());
  // Outside autocast an f16/bf16 CUDA input is taken as f32.
  if (compute == DType::f32 && x.dtype() != DType::f32) {
    return linear(detail::f32_from_half(x), weight, bias);
  }
  // The weight in the compute dtype, cast once: the backward's dX = G W reuses it, as the
  // cast torch.autocast records does (casting again there cost MobileNetV3-small's bf16 step a
  // second pass over its classifier's 1.6 M weights). Kept only where dX will be wanted: under
  // autocast it is a copy, held until the backward runs.
  const Tensor wc = detail::cast_for_compute(weight, compute).detach();
  Tensor out = gemm(x, false, wc, true, bias, compute, detail::autocast_output_dtype(compute));
  if (autograd::needs_grad({x, weight, bias})) {
    autograd::record("linear", {x, weight, bias}, {out},
                     [xd = x.detach(), wd = autograd::needs_grad({x}) ? wc : Tensor(), compute](
                         const autograd::GradList& g, const autograd::NeedsGrad& need) {
                       return linear_backward(g[0], xd, wd, need, compute);
                     });
  }
  return out;
}

Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& residual) {
  DPAR_PROFILE_SCOPE("linear_add");
  DPAR_CHECK(x.defined(), "linear_add: input is undefined");
  DPAR_CHECK(residual.defined(), "linear_add: residual is undefined");
  if (x.dim() != 2 && x.dim() >= 1) {
    const Tensor rows = as_rows(x, weight, "linear_add");
    const Shape out_shape = with_features(x, weight.size(0));
    DPAR_CHECK(residual.shape() == out_shape, "linear_add: residual ", residual.shape(),
               " does not match the output ", out_shape);
    return linear_add(rows, weight, bias, residual.reshape({rows.size(0), weight.size(0)}))
        .reshape(out_shape);
  }
  check_linear_operands(x, weight, bias, "linear_add");
  const Shape out_shape{x.size(0), weight.size(0)};
  DPAR_CHECK(detail::elementwise_dtype_ok(residual),
             "linear_add: residual must be f32 (or f16/bf16 on CUDA, bf16 on the CPU), got ",
             residual.str());
  DPAR_CHECK(residual.shape() == out_shape, "linear_add: residual ", residual.shape(),
             " does not match the output ", out_shape);
  DPAR_CHECK(residual.device() == x.device(), "linear_add: input on ", x.device(),
             " but residual on ", residual.device());
  const DType compute = detail::autocast_compute_dtype(x.device());
  // Outside autocast f16/bf16 CUDA operands are taken as f32.
  if (compute == DType::f32 && (x.dtype() != DType::f32 || residual.dtype() != DType::f32)) {
    return linear_add(detail::f32_from_half(x), weight, bias, detail::f32_from_half(residual));
  }
  const Tensor wc = detail::cast_for_compute(weight, compute).detach();  // as in linear
  Tensor out;
  if (compute == DType::f32 && kernels::linear_residual.available(x.device())) {
    out = Tensor::empty(out_shape, DType::f32, x.device());
    kernels::linear_residual.get(x.device())(x, wc, bias, residual.contiguous(), out);
  } else {
    // The product lands in the residual stream's dtype, which its gradient then has too.
    out = gemm(x, false, wc, true, bias, compute, residual.dtype());
    kernels::add_inplace.get(out.device())(out, residual, 1.0);
  }
  if (autograd::needs_grad({x, weight, bias, residual})) {
    autograd::record("linear_add", {x, weight, bias, residual}, {out},
                     [xd = x.detach(), wd = autograd::needs_grad({x}) ? wc : Tensor(), compute](
                         const autograd::GradList& g, const autograd::NeedsGrad& need) {
                       autograd::GradList grads = linear_backward(g[0], xd, wd, need, compute);
                       grads.push_back(need[3] ? g[0] : Tensor());  // d(residual) = G
                       return grads;
                     });
  }
  return out;
}

}  // namespace dpar
