// softmax, log_softmax, fused cross-entropy, argmax and top-k indices.
#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
#include "tensor/broadcast.h"
#include "tensor/elementwise_kernels.h"
#include "tensor/softmax_kernels.h"

namespace dpar {
namespace {

void check_f32(const Tensor& x, const char* op, const char* which) {
  DPAR_CHECK(x.defined(), op, ": ", which, " is undefined");
  DPAR_CHECK(x.dtype() == DType::f32, op, ": ", which, " must be f32, got ", x.str());
}

Tensor softmax_impl(const Tensor& x_in, int64_t dim, bool log, const char* op) {
  DPAR_PROFILE_SCOPE(op);
  check_f32(x_in, op, "input");
  DPAR_CHECK(x_in.dim() > 0, op, ": expects at least a 1-D tensor, got shape ", x_in.shape());
  const int64_t d = normalize_dim(dim, x_in.dim(), op);
  // The kernel wants input and output with one dense layout; any dense layout is kept.
  const Tensor x = x_in.is_dense() ? x_in : x_in.contiguous();
  Tensor out = Tensor::empty_like(x);
  kernels::softmax.get(x.device())(x, d, log, out);
  if (autograd::needs_grad({x_in})) {
    autograd::record(
        op, {x_in}, {out},
        [yd = out.detach(), d, log](const autograd::GradList& g, const autograd::NeedsGrad&) {
          Tensor grad = g[0];
          if (grad.strides() != yd.strides()) {
            grad = Tensor::empty_like(yd);
            grad.copy_(g[0]);
          }
          Tensor gx = Tensor::empty_like(yd);
          kernels::softmax_backward.get(yd.device())(grad, yd, d, log, gx);
          return autograd::GradList{gx};
        });
  }
  return out;
}

}  // namespace

// softmax, log_softmax and cross_entropy take f16/bf16 CUDA inputs (autocast's activations)
// as f32, as torch.autocast's fp32 list does: the exponentials and sums need f32's range.
Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(detail::f32_from_half(x), dim, false, "softmax");
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(detail::f32_from_half(x), dim, true, "log_softmax");
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, double label_smoothing) {
  DPAR_PROFILE_SCOPE("cross_entropy");
  const Tensor logits = detail::f32_from_half(logits_in);
  check_f32(logits, "cross_entropy", "logits");
  DPAR_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N,K], got shape ", logits.shape());
  DPAR_CHECK(target.defined(), "cross_entropy: target is undefined");
  DPAR_CHECK(target.dtype() == DType::i64, "cross_entropy: target must be i64 class indices, got ",
             target.str());
  DPAR_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), "cross_entropy: target shape ",
             target.shape(), " does not match logits ", logits.shape(), " (expected [",
             logits.size(0), "])");
  DPAR_CHECK(target.device() == logits.device(), "cross_entropy: logits on ", logits.device(),
             " but target on ", target.device());
  DPAR_CHECK(logits.size(0) > 0 && logits.size(1) > 0,
             "cross_entropy: expects a non-empty batch and at least one class, got logits ",
             logits.shape());
  DPAR_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
             "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  Tensor loss = Tensor::empty({}, DType::f32, logits.device());
  const bool grad_needed = autograd::needs_grad({logits});
  // Fused: the gradient (softmax - smoothed one-hot) / N is produced with the loss.
  Tensor grad = grad_needed ? Tensor::empty(logits.shape(), DType::f32, logits.device()) : Tensor();
  kernels::cross_entropy.get(logits.device())(logits, target, label_smoothing, loss, grad);
  if (grad_needed) {
    autograd::record("cross_entropy", {logits}, {loss},
                     [grad](const autograd::GradList& g, const autograd::NeedsGrad&) {
                       // Scale by the incoming scalar gradient (a fresh tensor every call).
                       Tensor gx = Tensor::empty_like(grad);
                       kernels::binary.get(grad.device())(
                           kernels::BinaryOp::mul, grad, detail::expand_to(g[0], grad.shape()), gx);
                       return autograd::GradList{gx};
                     });
  }
  return loss;
}

Tensor argmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = detail::f32_from_half(x_in);
  check_f32(x, "argmax", "input");
  DPAR_CHECK(x.dim() > 0, "argmax: expects at least a 1-D tensor, got shape ", x.shape());
  const int64_t d = normalize_dim(dim, x.dim(), "argmax");
  DPAR_CHECK(x.size(d) > 0, "argmax: dimension ", dim, " of ", x.shape(), " is empty");
  Shape out_shape;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i != d) out_shape.push_back(x.size(i));
  }
  Tensor out = Tensor::empty(out_shape, DType::i64, x.device());
  kernels::argmax.get(x.device())(x, d, out);
  return out;
}

Tensor topk_indices(const Tensor& x_in, int64_t k) {
  const Tensor x = detail::f32_from_half(x_in);
  check_f32(x, "topk_indices", "input");
  DPAR_CHECK(x.dim() == 2, "topk_indices: expects a 2-D tensor [N,K], got shape ", x.shape());
  DPAR_CHECK(k >= 1 && k <= x.size(1), "topk_indices: k = ", k, " must be in [1, ", x.size(1),
             "] for rows of ", x.shape());
  Tensor out = Tensor::empty({x.size(0), k}, DType::i64, x.device());
  kernels::topk_indices.get(x.device())(x, k, out);
  return out;
}

}  // namespace dpar
