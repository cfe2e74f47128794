// Pooling: global_avg_pool2d ([N,C,H,W] -> [N,C,1,1]), max_pool2d and avg_pool2d over k x k
// windows, adaptive_avg_pool2d to an n x m grid.
#include <array>

#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
#include "tensor/nn_kernels.h"
#include "tensor/window_pool.h"

namespace dpar {

Tensor global_avg_pool2d(const Tensor& x) {
  DPAR_PROFILE_SCOPE("global_avg_pool2d");
  DPAR_CHECK(x.defined(), "global_avg_pool2d: input is undefined");
  DPAR_CHECK(x.dim() == 4, "global_avg_pool2d: expected a 4-D input [N,C,H,W], got ", x.shape());
  DPAR_CHECK(detail::elementwise_dtype_ok(x), "global_avg_pool2d: input has dtype ", x.dtype(),
             " (shape ", x.shape(), ") on ", x.device(),
             "; global_avg_pool2d supports f32 (and f16/bf16 on CUDA, bf16 on the CPU)");
  DPAR_CHECK(x.size(2) > 0 && x.size(3) > 0, "global_avg_pool2d: input ", x.shape(),
             " has an empty spatial dimension");
  const Device device = x.device();
  const MemoryFormat format = x.is_contiguous(MemoryFormat::ChannelsLast) || !x.is_contiguous()
                                  ? MemoryFormat::ChannelsLast
                                  : MemoryFormat::Contiguous;
  const Tensor xc = detail::nn_layout_copy(x, format);
  // Channels-last, like the activations around it: [N,C,1,1] then has channels-last strides
  // (C,1,C,C), the layout the SE block's 1x1 convolutions read.
  Tensor y =
      Tensor::empty({x.size(0), x.size(1), 1, 1}, x.dtype(), device, MemoryFormat::ChannelsLast);
  if (y.numel() > 0) kernels::global_avg_pool2d_forward.get(device)(xc, y);
  if (autograd::needs_grad({x})) {
    autograd::record("global_avg_pool2d", {x}, {y},
                     [shape = x.shape(), dtype = x.dtype(), format, device](
                         const autograd::GradList& grads, const autograd::NeedsGrad&) {
                       // Where the engine holds x's gradient from elsewhere (the SE block's
                       // multiply) in x's layout, this one is added into it in place.
                       Tensor target = autograd::accumulation_target(0);
                       if (target.defined() && target.shape() == shape && target.dtype() == dtype &&
                           target.device() == device && target.is_contiguous(format) &&
                           target.numel() > 0 &&
                           kernels::global_avg_pool2d_backward_add.available(device)) {
                         kernels::global_avg_pool2d_backward_add.get(device)(grads[0], target);
                         return autograd::GradList{target};
                       }
                       Tensor dx = Tensor::empty(shape, dtype, device, format);
                       if (dx.numel() > 0) {
                         kernels::global_avg_pool2d_backward.get(device)(grads[0], dx);
                       }
                       return autograd::GradList{dx};
                     });
  }
  return y;
}

namespace {

using kernels::PoolGeometry;
using kernels::PoolKind;

// torch's output size: floor (or ceil) of (size + 2 pad - kernel) / stride + 1, where a
// ceil-mode window that would start in the right padding is dropped.
int64_t pooled_size(int64_t size, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  const int64_t span = size + 2 * p - k;
  if (span < 0) return 0;  // the window does not fit
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= size + p) --out;
  return out;
}

std::array<int64_t, 2> pair_of(const std::vector<int64_t>& v, const char* op, const char* what) {
  DPAR_CHECK(v.size() == 1 || v.size() == 2, op, ": ", what, " needs 1 or 2 values, got ",
             v.size());
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

void check_pool_input(const Tensor& x, const char* op) {
  DPAR_CHECK(x.defined(), op, ": input is undefined");
  DPAR_CHECK(x.dim() == 4, op, ": expected a 4-D input [N,C,H,W], got ", x.shape());
  DPAR_CHECK(detail::elementwise_dtype_ok(x), op, ": input must be f32, got ", x.str(), " on ",
             x.device());
}

// The window kernels compute in f32: an f16/bf16 input is pooled as f32 (autocast's fp32
// list).
Tensor run_pool(const PoolGeometry& g, const Tensor& input, const char* op) {
  const Tensor x = detail::f32_from_half(input);
  const MemoryFormat format = x.is_contiguous(MemoryFormat::ChannelsLast)
                                  ? MemoryFormat::ChannelsLast
                                  : MemoryFormat::Contiguous;
  Tensor y = Tensor::empty({g.N, g.C, g.OH, g.OW}, DType::f32, x.device(), format);
  Tensor indices;
  if (g.kind == PoolKind::max) {
    indices = Tensor::empty(y.shape(), DType::i64, x.device(), format);
  }
  kernels::pool2d_forward.get(x.device())(g, x, y, indices);
  if (autograd::needs_grad({x})) {
    autograd::record(op, {x}, {y},
                     [g, indices, format, device = x.device()](const autograd::GradList& grads,
                                                               const autograd::NeedsGrad&) {
                       Tensor dx = Tensor::empty({g.N, g.C, g.H, g.W}, DType::f32, device, format);
                       kernels::pool2d_backward.get(device)(g, grads[0], indices, dx);
                       return autograd::GradList{dx};
                     });
  }
  return y;
}

PoolGeometry window_geometry(const Tensor& x, PoolKind kind, const std::vector<int64_t>& kernel,
                             const std::vector<int64_t>& stride,
                             const std::vector<int64_t>& padding, bool ceil_mode, const char* op) {
  check_pool_input(x, op);
  PoolGeometry g;
  g.kind = kind;
  g.N = x.size(0);
  g.C = x.size(1);
  g.H = x.size(2);
  g.W = x.size(3);
  const auto k = pair_of(kernel, op, "kernel_size");
  // torch: the stride defaults to the kernel size.
  const auto s = stride.empty() ? k : pair_of(stride, op, "stride");
  const auto p = pair_of(padding, op, "padding");
  for (int d = 0; d < 2; ++d) {
    DPAR_CHECK(k[d] > 0 && s[d] > 0, op, ": kernel_size and stride must be positive, got ", k[d],
               " and ", s[d]);
    DPAR_CHECK(p[d] >= 0 && p[d] * 2 <= k[d], op, ": padding ", p[d],
               " must be at most half the kernel size ", k[d]);
    g.kernel[d] = k[d];
    g.stride[d] = s[d];
    g.padding[d] = p[d];
  }
  g.OH = pooled_size(g.H, k[0], s[0], p[0], ceil_mode);
  g.OW = pooled_size(g.W, k[1], s[1], p[1], ceil_mode);
  DPAR_CHECK(g.OH > 0 && g.OW > 0, op, ": input ", x.shape(), " is smaller than the ", k[0], "x",
             k[1], " window (with padding ", p[0], "x", p[1], ")");
  return g;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, const std::vector<int64_t>& kernel_size,
                  const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                  bool ceil_mode) {
  DPAR_PROFILE_SCOPE("max_pool2d");
  return run_pool(
      window_geometry(x, PoolKind::max, kernel_size, stride, padding, ceil_mode, "max_pool2d"), x,
      "max_pool2d");
}

Tensor avg_pool2d(const Tensor& x, const std::vector<int64_t>& kernel_size,
                  const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                  bool ceil_mode, bool count_include_pad) {
  DPAR_PROFILE_SCOPE("avg_pool2d");
  PoolGeometry g =
      window_geometry(x, PoolKind::avg, kernel_size, stride, padding, ceil_mode, "avg_pool2d");
  g.count_include_pad = count_include_pad;
  return run_pool(g, x, "avg_pool2d");
}

Tensor adaptive_avg_pool2d(const Tensor& x, const std::vector<int64_t>& output_size) {
  DPAR_PROFILE_SCOPE("adaptive_avg_pool2d");
  check_pool_input(x, "adaptive_avg_pool2d");
  const auto out = pair_of(output_size, "adaptive_avg_pool2d", "output_size");
  DPAR_CHECK(out[0] > 0 && out[1] > 0, "adaptive_avg_pool2d: output size must be positive, got ",
             out[0], "x", out[1]);
  DPAR_CHECK(x.size(2) > 0 && x.size(3) > 0, "adaptive_avg_pool2d: input ", x.shape(),
             " has an empty spatial dimension");
  PoolGeometry g;
  g.kind = PoolKind::adaptive_avg;
  g.N = x.size(0);
  g.C = x.size(1);
  g.H = x.size(2);
  g.W = x.size(3);
  g.OH = out[0];
  g.OW = out[1];
  return run_pool(g, x, "adaptive_avg_pool2d");
}

}  // namespace dpar
