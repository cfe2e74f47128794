#pragma once
// Kernel slots for convolution, batch normalisation and pooling. The ops (ops_conv.cpp,
// ops_norm.cpp, ops_pool.cpp) check arguments and bring tensors into the layouts described
// here; kernels only compute.
#include <cstdint>

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"
#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

// Everything that determines a 2-D convolution's shapes. Input [N,C,H,W], weight
// [O,C/groups,kH,kW], output [N,O,OH,OW]; padding is symmetric, dilation 1 = dense kernel.
struct Conv2dGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t O = 0, kH = 0, kW = 0;
  int64_t OH = 0, OW = 0;
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
  bool has_bias = false;
};

// x and y channels-last, weight contiguous, bias [O] contiguous or undefined. training selects
// the forward_training variant (needed when a backward pass follows).
DPAR_KERNEL(conv2d_forward,
            void(const kernels::Conv2dGeometry& g, const Tensor& x, const Tensor& weight,
                 const Tensor& bias, Tensor& y, bool training));
// dy and dx channels-last, weight contiguous.
DPAR_KERNEL(conv2d_backward_data, void(const kernels::Conv2dGeometry& g, const Tensor& dy,
                                       const Tensor& weight, Tensor& dx));
// x and dy channels-last; dweight contiguous [O,C/groups,kH,kW]; dbias [O] when g.has_bias.
DPAR_KERNEL(conv2d_backward_weights, void(const kernels::Conv2dGeometry& g, const Tensor& x,
                                          const Tensor& dy, Tensor& dweight, Tensor& dbias));

// Batch normalisation over a 4-D x that is contiguous or channels-last; y has x's strides.
// weight/bias are contiguous [C] or undefined. With use_batch_stats the batch mean and biased
// variance are written to mean/var; otherwise mean/var are read (running statistics).
// need_backward selects a forward variant the backward kernel can use as its hint.
DPAR_KERNEL(batch_norm_forward,
            void(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& mean,
                 Tensor& var, bool use_batch_stats, bool need_backward, double eps, Tensor& y));
// The same forward followed by an activation, in one pass over the output: writes y and
// z = act(y) (both with x's strides), z with the bits the unary kernel would give from y; y
// may be undefined, and then only z is written. An optional fast path
// (KernelSlot::available): where a backend lacks it, the op runs the two.
DPAR_KERNEL(batch_norm_act_forward, void(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         Tensor& mean, Tensor& var, bool use_batch_stats,
                                         double eps, Activation act, Tensor& y, Tensor& z));
// dy and dx have x's strides. weight/bias are the forward's; dweight/dbias ([C]) are
// allocated exactly when weight/bias are defined.
DPAR_KERNEL(batch_norm_backward,
            void(const Tensor& x, const Tensor& dy, const Tensor& weight, const Tensor& bias,
                 const Tensor& mean, const Tensor& var, bool use_batch_stats, double eps,
                 Tensor& dx, Tensor& dweight, Tensor& dbias));
// The same gradients computed from the forward OUTPUT y instead of x (x_hat = (y - bias) /
// weight), so a training step need not keep the input of every BatchNorm alive: the output is
// kept anyway by the activation or convolution after it. Needs every |weight| large enough
// for the division (the op checks). dz is the gradient of act(y) (of y itself for
// Activation::none); the activation's gradient is formed on the fly. y, dz and dx share one
// layout (contiguous or channels-last); var is the forward's (batch or running; the mean
// enters only through y). CPU only: the weight check reads the weights on the host, which on a
// GPU would synchronise every layer and step, so GPUs keep the input and use the above.
DPAR_KERNEL(batch_norm_backward_from_output,
            void(const Tensor& y, const Tensor& dz, const Tensor& weight, const Tensor& bias,
                 const Tensor& var, bool use_batch_stats, double eps, Activation act, Tensor& dx,
                 Tensor& dweight, Tensor& dbias));
// The backward of batch_norm_act_forward from its input x, where the forward kept neither y
// nor z: the activation's input y is formed again from x, mean and var as the forward formed
// it, then dz (the gradient of z) becomes dy and dy the gradients of x, weight and bias. x, dz
// and dx share one layout; mean and var are the forward's (batch or running). So a training
// step keeps one activation per BatchNorm + activation, x, and the forward writes only z.
// Optional (CPU, f32).
DPAR_KERNEL(batch_norm_act_backward,
            void(const Tensor& x, const Tensor& dz, const Tensor& weight, const Tensor& bias,
                 const Tensor& mean, const Tensor& var, bool use_batch_stats, double eps,
                 Activation act, Tensor& dx, Tensor& dweight, Tensor& dbias));
// running = (1-momentum)*running + momentum*batch, with the variance made unbiased by
// count/(count-1) (count = N*H*W). Running tensors are 1-D [C], any stride.
DPAR_KERNEL(batch_norm_update_stats,
            void(Tensor& running_mean, Tensor& running_var, const Tensor& batch_mean,
                 const Tensor& batch_var, double momentum, int64_t count));

// y [N,C,1,1] = mean of x over H and W; x contiguous or channels-last.
DPAR_KERNEL(global_avg_pool2d_forward, void(const Tensor& x, Tensor& y));
// dx (contiguous or channels-last) = dy / (H*W) broadcast over H and W; dy [N,C,1,1] any
// strides.
DPAR_KERNEL(global_avg_pool2d_backward, void(const Tensor& dy, Tensor& dx));
// The same gradient added into dx, which holds the gradient x has from elsewhere (the SE
// block's multiply): one pass over dx, where writing the broadcast and adding it took three.
// Optional (the CPU).
DPAR_KERNEL(global_avg_pool2d_backward_add, void(const Tensor& dy, Tensor& dx));

}  // namespace dpar::kernels

namespace dpar::detail {

// t itself when it already has the layout, else a copy in that layout. Not recorded by
// autograd: the nn ops record themselves against their original inputs.
// The dtype an autocast-eligible op (conv2d, linear, matmul) computes in on `device`: the
// autocast dtype on CUDA, else f32.
DType autocast_compute_dtype(Device device);

// t in `dtype`, keeping its layout; no autograd record (the op records its own backward).
inline Tensor cast_for_compute(const Tensor& t, DType dtype) {
  if (!t.defined() || t.dtype() == dtype) return t;
  NoGradGuard no_grad;
  return t.to(dtype);
}

inline Tensor nn_layout_copy(const Tensor& t, MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device(), format);
  out.copy_(t);
  return out;
}

}  // namespace dpar::detail
