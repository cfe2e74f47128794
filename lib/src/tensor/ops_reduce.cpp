// sum and mean over all elements or over dims.
#include <algorithm>

#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
#include "tensor/broadcast.h"
#include "tensor/elementwise_kernels.h"

namespace dpar {
namespace {

// Keepdim shape for reducing `dims` (empty = all) of shape.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, const char* op) {
  Shape keep = shape;
  if (dims.empty()) {
    std::fill(keep.begin(), keep.end(), 1);
    return keep;
  }
  for (int64_t d : dims) keep[normalize_dim(d, static_cast<int64_t>(shape.size()), op)] = 1;
  return keep;
}

Tensor reduce_sum(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim, double scale,
                  const char* op) {
  DPAR_PROFILE_SCOPE(op);
  const Tensor x = detail::f32_from_half(x_in);  // autocast's fp32 list
  DPAR_CHECK(x.defined() && x.dtype() == DType::f32, op, ": expects an f32 tensor, got ", x.str());
  const bool all = dims.empty();
  const Shape keep = reduced_shape(x.shape(), dims, op);
  Tensor out = Tensor::empty(keep, DType::f32, x.device());
  kernels::sum_to.get(x.device())(x, out);
  if (scale != 1.0) kernels::affine.get(x.device())(out, scale, 0.0, out);
  // Without keepdim the reduced dims disappear (all dims for a full reduction).
  Shape final_shape;
  if (keepdim) {
    final_shape = keep;
  } else if (!all) {
    std::vector<bool> reduced(x.shape().size(), false);
    for (int64_t d : dims) reduced[normalize_dim(d, x.dim(), op)] = true;
    for (size_t i = 0; i < keep.size(); ++i) {
      if (!reduced[i]) final_shape.push_back(keep[i]);
    }
  }
  out = out.view(final_shape);
  if (autograd::needs_grad({x})) {
    autograd::record(op, {x}, {out},
                     [keep, in_shape = x.shape(), scale](const autograd::GradList& g,
                                                         const autograd::NeedsGrad&) {
                       Tensor gk = g[0].reshape(keep);
                       Tensor full = Tensor::empty(in_shape, DType::f32, gk.device());
                       kernels::affine.get(gk.device())(detail::expand_to(gk, in_shape), scale, 0.0,
                                                        full);
                       return autograd::GradList{full};
                     });
  }
  return out;
}

int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  if (dims.empty()) return x.numel();
  int64_t n = 1;
  for (int64_t d : dims) n *= x.shape()[normalize_dim(d, x.dim(), op)];
  return n;
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce_sum(x, {}, false, 1.0, "sum"); }
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  DPAR_CHECK(!dims.empty(), "sum: empty dimension list (use sum(x) for all elements)");
  return reduce_sum(x, dims, keepdim, 1.0, "sum");
}
Tensor mean(const Tensor& x) {
  DPAR_CHECK(x.defined() && x.numel() > 0, "mean: empty tensor ", x.str());
  return reduce_sum(x, {}, false, 1.0 / static_cast<double>(x.numel()), "mean");
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  DPAR_CHECK(!dims.empty(), "mean: empty dimension list (use mean(x) for all elements)");
  const int64_t n = reduced_count(x, dims, "mean");
  DPAR_CHECK(n > 0, "mean: reducing over an empty dimension of ", x.shape());
  return reduce_sum(x, dims, keepdim, 1.0 / static_cast<double>(n), "mean");
}

}  // namespace dpar
