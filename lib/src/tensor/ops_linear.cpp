// matmul and linear (y = x W^T + b), both on the gemm kernel slot.
#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/elementwise_kernels.h"
#include "tensor/linear_kernels.h"
#include "tensor/nn_kernels.h"

namespace dpar {
namespace {

void check_matrix(const Tensor& t, const char* op, const char* which) {
  DPAR_CHECK(t.defined(), op, ": ", which, " is undefined");
  DPAR_CHECK(t.dtype() == DType::f32, op, ": ", which, " must be f32, got ", t.str());
  DPAR_CHECK(t.dim() == 2, op, ": ", which, " must be 2-D, got shape ", t.shape());
}

// op(a) * op(b) (+ bias) into a new contiguous f32 matrix, computed in `compute` (f16/bf16 under
// autocast on CUDA: the operands are cast, cuBLAS accumulates in f32, the result is cast back).
Tensor gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
            DType compute) {
  const int64_t m = trans_a ? a.size(1) : a.size(0);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  Tensor c = Tensor::empty({m, n}, compute, a.device());
  kernels::gemm.get(a.device())(detail::cast_for_compute(a, compute), trans_a,
                                detail::cast_for_compute(b, compute), trans_b,
                                detail::cast_for_compute(bias, compute), c);
  return detail::cast_for_compute(c, DType::f32);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  DPAR_PROFILE_SCOPE("matmul");
  check_matrix(a, "matmul", "first operand");
  check_matrix(b, "matmul", "second operand");
  DPAR_CHECK(a.size(1) == b.size(0), "matmul: inner dimensions differ: ", a.shape(), " x ",
             b.shape());
  DPAR_CHECK(a.device() == b.device(), "matmul: operands on different devices (", a.device(),
             " and ", b.device(), ")");
  const DType compute = detail::autocast_compute_dtype(a.device());
  Tensor out = gemm(a, false, b, false, {}, compute);
  if (autograd::needs_grad({a, b})) {
    autograd::record("matmul", {a, b}, {out},
                     [ad = a.detach(), bd = b.detach(), compute](const autograd::GradList& g,
                                                                 const autograd::NeedsGrad& need) {
                       // dA = G B^T, dB = A^T G
                       return autograd::GradList{
                           need[0] ? gemm(g[0], false, bd, true, {}, compute) : Tensor(),
                           need[1] ? gemm(ad, true, g[0], false, {}, compute) : Tensor()};
                     });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DPAR_PROFILE_SCOPE("linear");
  check_matrix(x, "linear", "input");
  check_matrix(weight, "linear", "weight");
  DPAR_CHECK(x.size(1) == weight.size(1), "linear: input ", x.shape(), " has ", x.size(1),
             " features but weight ", weight.shape(), " expects ", weight.size(1));
  DPAR_CHECK(x.device() == weight.device(), "linear: input on ", x.device(), " but weight on ",
             weight.device());
  if (bias.defined()) {
    DPAR_CHECK(bias.dtype() == DType::f32, "linear: bias must be f32, got ", bias.str());
    DPAR_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias shape ",
               bias.shape(), " does not match weight ", weight.shape(), " (expected [",
               weight.size(0), "])");
    DPAR_CHECK(bias.device() == x.device(), "linear: input on ", x.device(), " but bias on ",
               bias.device());
  }
  const DType compute = detail::autocast_compute_dtype(x.device());
  Tensor out = gemm(x, false, weight, true, bias, compute);
  if (autograd::needs_grad({x, weight, bias})) {
    autograd::record("linear", {x, weight, bias}, {out},
                     [xd = x.detach(), wd = weight.detach(), compute](
                         const autograd::GradList& g, const autograd::NeedsGrad& need) {
                       Tensor gx, gw, gb;
                       if (need[0]) gx = gemm(g[0], false, wd, false, {}, compute);  // G W
                       if (need[1]) gw = gemm(g[0], true, xd, false, {}, compute);   // G^T X
                       if (need[2]) {
                         // Column sums of G, accumulated in a fixed order (deterministic).
                         gb = Tensor::empty({1, g[0].size(1)}, DType::f32, g[0].device());
                         kernels::sum_to.get(g[0].device())(g[0], gb);
                         gb = gb.view({g[0].size(1)});
                       }
                       return autograd::GradList{gx, gw, gb};
                     });
  }
  return out;
}

}  // namespace dpar
