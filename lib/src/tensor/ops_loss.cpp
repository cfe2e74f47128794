// Losses composed from differentiable ops: nll_loss, cross_entropy with ignore_index, mse_loss
// and binary_cross_entropy_with_logits. (cross_entropy without ignore_index is the fused
// kernel in ops_softmax.cpp.)
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"

namespace dpar {
namespace {

Tensor reduce(const Tensor& per_element, Reduction reduction) {
  switch (reduction) {
    case Reduction::mean:
      return mean(per_element);
    case Reduction::sum:
      return sum(per_element);
    case Reduction::none:
      break;
  }
  return per_element;
}

void check_class_target(const Tensor& scores, const Tensor& target, const char* op) {
  DPAR_CHECK(scores.defined() && detail::elementwise_dtype_ok(scores) && scores.dim() == 2, op,
             ": expects f32 scores [N,C], got ", scores.defined() ? scores.str() : "undefined");
  DPAR_CHECK(target.defined() && target.dtype() == DType::i64, op,
             ": target must be i64 class indices, got ",
             target.defined() ? target.str() : "undefined");
  DPAR_CHECK(target.dim() == 1 && target.size(0) == scores.size(0), op, ": target shape ",
             target.shape(), " does not match ", scores.shape(), " (expected [", scores.size(0),
             "])");
  DPAR_CHECK(target.device() == scores.device(), op, ": scores on ", scores.device(),
             " but target on ", target.device());
}

// -log p[target] per row (and -mean log p for label smoothing), with rows whose target is
// ignore_index contributing nothing; the mean is over the rows that count, as in PyTorch (all
// rows ignored: 0/0 = NaN, as there).
Tensor masked_class_loss(const Tensor& logp, const Tensor& target, double label_smoothing,
                         std::optional<int64_t> ignore_index, Reduction reduction) {
  Tensor valid, safe = target;
  if (ignore_index) {
    // Class indices are exact in f32 (below 2^24), so the masking runs on every device.
    const Tensor target_f = target.to(DType::f32);
    valid = ne(target_f, static_cast<double>(*ignore_index));
    safe = where(valid, target_f, 0.0).to(DType::i64);
  }
  Tensor per = neg(gather(logp, 1, safe.unsqueeze(1)).squeeze(1));
  if (label_smoothing > 0) {
    per = add(mul(per, 1.0 - label_smoothing), mul(neg(mean(logp, {1})), label_smoothing));
  }
  if (!valid.defined()) return reduce(per, reduction);
  per = where(valid, per, 0.0);
  if (reduction != Reduction::mean) return reduce(per, reduction);
  return div(sum(per), sum(valid.to(DType::f32)));
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs_in, const Tensor& target,
                std::optional<int64_t> ignore_index, Reduction reduction) {
  DPAR_PROFILE_SCOPE("nll_loss");
  const Tensor log_probs = detail::f32_from_half(log_probs_in);  // autocast's fp32 list
  check_class_target(log_probs, target, "nll_loss");
  return masked_class_loss(log_probs, target, 0.0, ignore_index, reduction);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing,
                     std::optional<int64_t> ignore_index) {
  if (!ignore_index) return cross_entropy(logits, target, label_smoothing);
  DPAR_PROFILE_SCOPE("cross_entropy_ignore_index");
  check_class_target(logits, target, "cross_entropy");
  DPAR_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
             "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  return masked_class_loss(log_softmax(logits, 1), target, label_smoothing, ignore_index,
                           Reduction::mean);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  DPAR_PROFILE_SCOPE("mse_loss");
  DPAR_CHECK(input.defined() && target.defined() && input.shape() == target.shape(),
             "mse_loss: input ", input.defined() ? input.shape() : Shape{}, " and target ",
             target.defined() ? target.shape() : Shape{}, " must have the same shape");
  // In f32 (autocast's fp32 list), whatever the dtypes of an autocast model's output.
  return reduce(square(sub(detail::f32_from_half(input), detail::f32_from_half(target))),
                reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction) {
  DPAR_PROFILE_SCOPE("binary_cross_entropy_with_logits");
  DPAR_CHECK(logits.defined() && target.defined() && logits.shape() == target.shape(),
             "binary_cross_entropy_with_logits: logits ",
             logits.defined() ? logits.shape() : Shape{}, " and target ",
             target.defined() ? target.shape() : Shape{}, " must have the same shape");
  // (1 - y) x + log(1 + e^-x): stable for any x (softplus is linear past its threshold), and
  // its gradient is exactly sigmoid(x) - y.
  const Tensor x = detail::f32_from_half(logits), y = detail::f32_from_half(target);
  return reduce(add(mul(sub(Tensor::ones({}, DType::f32, y.device()), y), x), softplus(neg(x))),
                reduction);
}

}  // namespace dpar
