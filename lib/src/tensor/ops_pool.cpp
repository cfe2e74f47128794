// global_avg_pool2d: [N,C,H,W] -> [N,C,1,1] mean over the spatial dims.
#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/nn_kernels.h"

namespace dpar {

Tensor global_avg_pool2d(const Tensor& x) {
  DPAR_PROFILE_SCOPE("global_avg_pool2d");
  DPAR_CHECK(x.defined(), "global_avg_pool2d: input is undefined");
  DPAR_CHECK(x.dim() == 4, "global_avg_pool2d: expected a 4-D input [N,C,H,W], got ", x.shape());
  DPAR_CHECK(x.dtype() == DType::f32, "global_avg_pool2d: input has dtype ", x.dtype(), " (shape ",
             x.shape(), "); global_avg_pool2d supports f32");
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
      Tensor::empty({x.size(0), x.size(1), 1, 1}, DType::f32, device, MemoryFormat::ChannelsLast);
  if (y.numel() > 0) kernels::global_avg_pool2d_forward.get(device)(xc, y);
  if (autograd::needs_grad({x})) {
    autograd::record("global_avg_pool2d", {x}, {y},
                     [shape = x.shape(), format, device](const autograd::GradList& grads,
                                                         const autograd::NeedsGrad&) {
                       Tensor dx = Tensor::empty(shape, DType::f32, device, format);
                       if (dx.numel() > 0) {
                         kernels::global_avg_pool2d_backward.get(device)(grads[0], dx);
                       }
                       return autograd::GradList{dx};
                     });
  }
  return y;
}

}  // namespace dpar
