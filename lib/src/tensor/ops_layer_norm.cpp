// layer_norm and group_norm (through layer_norm's kernels: a group is one row).
#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/layer_norm_kernels.h"

namespace dpar {
namespace {

void check_param(const Tensor& t, int64_t d, const Tensor& x, const char* op, const char* which) {
  if (!t.defined()) return;
  DPAR_CHECK(t.dtype() == DType::f32, op, ": ", which, " must be f32, got ", t.str());
  DPAR_CHECK(t.numel() == d, op, ": ", which, " has shape ", t.shape(),
             " but the normalised part of ", x.shape(), " has ", d, " elements");
  DPAR_CHECK(t.device() == x.device(), op, ": input on ", x.device(), " but ", which, " on ",
             t.device());
}

// Normalises each row of x2 [R, D] (any strides: made contiguous), with optional per-column
// weight and bias ([D] after flattening).
Tensor normalize_rows(const Tensor& x2, const Tensor& weight, const Tensor& bias, double eps,
                      const char* op) {
  const Tensor x = x2.is_contiguous() ? x2 : x2.contiguous();
  const Tensor w = weight.defined() ? weight.reshape({weight.numel()}).contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.reshape({bias.numel()}).contiguous() : Tensor();
  const int64_t rows = x.size(0);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  Tensor mean = Tensor::empty({rows}, DType::f32, x.device());
  Tensor rstd = Tensor::empty({rows}, DType::f32, x.device());
  kernels::layer_norm_forward.get(x.device())(x, w, b, eps, y, mean, rstd);
  if (autograd::needs_grad({x, w, b})) {
    autograd::record(op, {x, w, b}, {y},
                     [xd = x.detach(), wd = w.defined() ? w.detach() : Tensor(), mean, rstd](
                         const autograd::GradList& g, const autograd::NeedsGrad& need) {
                       const Tensor dy = g[0].is_contiguous() ? g[0] : g[0].contiguous();
                       Tensor dx, dw, db;
                       if (need[0]) dx = Tensor::empty(xd.shape(), DType::f32, xd.device());
                       if (need[1]) dw = Tensor::empty({xd.size(1)}, DType::f32, xd.device());
                       if (need[2]) db = Tensor::empty({xd.size(1)}, DType::f32, xd.device());
                       kernels::layer_norm_backward.get(xd.device())(xd, dy, wd, mean, rstd, dx, dw,
                                                                     db);
                       return autograd::GradList{dx, dw, db};
                     });
  }
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  DPAR_PROFILE_SCOPE("layer_norm");
  DPAR_CHECK(x.defined() && x.dtype() == DType::f32, "layer_norm: input must be f32, got ",
             x.defined() ? x.str() : std::string("undefined"));
  const auto k = static_cast<int64_t>(normalized_shape.size());
  DPAR_CHECK(k >= 1 && k <= x.dim(), "layer_norm: normalized_shape ", normalized_shape,
             " must name the last 1..", x.dim(), " dims of input ", x.shape());
  for (int64_t i = 0; i < k; ++i) {
    DPAR_CHECK(x.size(x.dim() - k + i) == normalized_shape[static_cast<size_t>(i)],
               "layer_norm: normalized_shape ", normalized_shape,
               " does not match the last dims of ", x.shape());
  }
  DPAR_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  const int64_t d = shape_numel(normalized_shape);
  check_param(weight, d, x, "layer_norm", "weight");
  check_param(bias, d, x, "layer_norm", "bias");
  DPAR_CHECK(d > 0, "layer_norm: the normalised part of ", x.shape(), " is empty");
  return normalize_rows(x.reshape({x.numel() / d, d}), weight, bias, eps, "layer_norm")
      .view(x.shape());
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  DPAR_PROFILE_SCOPE("group_norm");
  DPAR_CHECK(x.defined() && x.dtype() == DType::f32, "group_norm: input must be f32, got ",
             x.defined() ? x.str() : std::string("undefined"));
  DPAR_CHECK(x.dim() >= 2, "group_norm: expected [N,C,...], got ", x.shape());
  const int64_t n = x.size(0), c = x.size(1);
  DPAR_CHECK(num_groups > 0 && c % num_groups == 0, "group_norm: ", c,
             " channels cannot be split into ", num_groups, " groups");
  check_param(weight, c, x, "group_norm", "weight");
  check_param(bias, c, x, "group_norm", "bias");
  // Each (sample, group) is one row of the layer-norm kernels; the per-channel affine map
  // follows as broadcast ops.
  const int64_t per_row = x.numel() / std::max<int64_t>(1, n * num_groups);
  Tensor y =
      normalize_rows(x.contiguous().view({n * num_groups, per_row}), {}, {}, eps, "group_norm")
          .view(x.shape());
  Shape channel_shape(static_cast<size_t>(x.dim()), 1);
  channel_shape[1] = c;
  if (weight.defined()) y = mul(y, weight.view(channel_shape));
  if (bias.defined()) y = add(y, bias.view(channel_shape));
  return y;
}

}  // namespace dpar
