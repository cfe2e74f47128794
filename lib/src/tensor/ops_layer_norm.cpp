// layer_norm and group_norm (through layer_norm's kernels: a group is one row).
#include "dpar/autograd/function.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
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

// What normalize_rows' backward needs: the flattened input [R, D], weight [D] (or undefined),
// the statistics, and the shapes its gradients must have.
struct SavedRows {
  Tensor x2, w, mean, rstd;
  Shape x_shape, w_shape, b_shape;
};

// dx, dweight and dbias from the output's gradient. On the CPU, x's gradient is added into the
// accumulation target when the engine holds one (a residual connection's gradient), which saves
// the pass that would add the two, with the same bits.
autograd::GradList normalize_rows_backward(const SavedRows& s, const Tensor& grad_y,
                                           const autograd::NeedsGrad& need) {
  const int64_t rows = s.x2.size(0), d = s.x2.size(1);
  const Device device = s.x2.device();
  const Tensor dy = grad_y.reshape({rows, d}).contiguous();
  Tensor dx, dw, db;
  bool accumulate = false;
  if (need[0]) {
    Tensor target = autograd::accumulation_target(0);
    accumulate = device.is_cpu() && target.defined() && target.shape() == s.x_shape &&
                 target.device() == device && target.is_contiguous();
    dx = accumulate ? target : Tensor::empty(s.x_shape, DType::f32, device);
  }
  if (need[1]) dw = Tensor::empty(s.w_shape, DType::f32, device);
  if (need[2]) db = Tensor::empty(s.b_shape, DType::f32, device);
  Tensor dx_rows = dx.defined() ? dx.view({rows, d}) : Tensor();
  Tensor dw_flat = dw.defined() ? dw.view({d}) : Tensor();
  Tensor db_flat = db.defined() ? db.view({d}) : Tensor();
  kernels::layer_norm_backward.get(device)(s.x2, dy, s.w, s.mean, s.rstd, dx_rows, dw_flat, db_flat,
                                           accumulate);
  return {dx, dw, db};
}

// Normalises x as rows of its last d elements ([R, D] after flattening; any strides: made
// contiguous), with optional per-column weight and bias (d elements, any shape). The node is
// recorded on x, weight and bias themselves, not on flattened views of them, so that its
// backward sees x's own gradient sum as its accumulation target.
Tensor normalize_rows(const Tensor& x, int64_t d, const Tensor& weight, const Tensor& bias,
                      double eps, const char* op) {
  const int64_t rows = x.numel() / d;
  SavedRows saved;
  Tensor b, y;
  {
    NoGradGuard flat;  // views for the kernels, not recorded
    saved.x2 = x.reshape({rows, d}).contiguous().detach();
    if (weight.defined()) saved.w = weight.reshape({d}).contiguous().detach();
    if (bias.defined()) b = bias.reshape({d}).contiguous();
    y = Tensor::empty({rows, d}, DType::f32, x.device());
  }
  saved.mean = Tensor::empty({rows}, DType::f32, x.device());
  saved.rstd = Tensor::empty({rows}, DType::f32, x.device());
  kernels::layer_norm_forward.get(x.device())(saved.x2, saved.w, b, eps, y, saved.mean, saved.rstd);
  {
    NoGradGuard reshape;
    y = y.view(x.shape());
  }
  if (autograd::needs_grad({x, weight, bias})) {
    saved.x_shape = x.shape();
    if (weight.defined()) saved.w_shape = weight.shape();
    if (bias.defined()) saved.b_shape = bias.shape();
    autograd::record(
        op, {x, weight, bias}, {y},
        [saved = std::move(saved)](const autograd::GradList& g, const autograd::NeedsGrad& need) {
          return normalize_rows_backward(saved, g[0], need);
        });
  }
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  DPAR_PROFILE_SCOPE("layer_norm");
  const Tensor x = detail::f32_from_half(x_in);  // autocast's fp32 list
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
  return normalize_rows(x, d, weight, bias, eps, "layer_norm");
}

Tensor group_norm(const Tensor& x_in, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  DPAR_PROFILE_SCOPE("group_norm");
  const Tensor x = detail::f32_from_half(x_in);  // autocast's fp32 list
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
  Tensor y = normalize_rows(x, per_row, {}, {}, eps, "group_norm");
  Shape channel_shape(static_cast<size_t>(x.dim()), 1);
  channel_shape[1] = c;
  if (weight.defined()) y = mul(y, weight.view(channel_shape));
  if (bias.defined()) y = add(y, bias.view(channel_shape));
  return y;
}

}  // namespace dpar
