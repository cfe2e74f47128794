// batch_norm: argument checks, running-statistics update and the autograd record.
#include <algorithm>
#include <cmath>

#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/activation_kernels.h"
#include "tensor/autocast_policy.h"
#include "tensor/nn_kernels.h"

namespace dpar {
namespace {

void check_channel_vector(const Tensor& t, int64_t C, const Tensor& x, const char* which) {
  if (!t.defined()) return;
  DPAR_CHECK(t.dtype() == DType::f32, "batch_norm: ", which, " has dtype ", t.dtype(),
             "; batch_norm supports f32");
  DPAR_CHECK(t.dim() == 1 && t.size(0) == C, "batch_norm: ", which, " must have shape [", C,
             "] for input ", x.shape(), ", got ", t.shape());
  DPAR_CHECK(t.device() == x.device(), "batch_norm: input on ", x.device(), " but ", which, " on ",
             t.device());
}

// Whether x_hat = (y - bias) / weight is accurate enough for the backward: every |weight| at
// least kMinWeight (y carries f32 rounding of about 1e-7 |y|, amplified by 1/|weight|).
bool weights_invertible(const Tensor& weight) {
  constexpr float kMinWeight = 1e-3f;
  if (!weight.defined()) return true;
  const std::vector<float> w = weight.to_float_vector();
  return std::all_of(w.begin(), w.end(), [](float v) { return std::fabs(v) >= kMinWeight; });
}

// The unary kernel that computes act (forward) and its gradient from its input y.
kernels::UnaryOp unary_op(Activation act) {
  switch (act) {
    case Activation::relu:
      return kernels::UnaryOp::relu;
    case Activation::hardswish:
      return kernels::UnaryOp::hardswish;
    case Activation::none:
      break;
  }
  DPAR_FAIL("batch_norm_act: no unary kernel for Activation::none");
}

}  // namespace

Tensor batch_norm_act(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      Tensor running_mean, Tensor running_var, bool training, double momentum,
                      double eps, Activation act) {
  DPAR_CHECK(x.defined(), "batch_norm: input is undefined");
  if (x.dim() == 2 || x.dim() == 3) {
    // BatchNorm1d: [N,C] and [N,C,L] are [N,C,1,1] and [N,C,L,1] to the 4-D kernels (the
    // statistics run over N and L either way); views, so autograd sees the reshape.
    const Shape shape4 = x.dim() == 2 ? Shape{x.size(0), x.size(1), 1, 1}
                                      : Shape{x.size(0), x.size(1), x.size(2), 1};
    return batch_norm_act(x.reshape(shape4), weight, bias, std::move(running_mean),
                          std::move(running_var), training, momentum, eps, act)
        .reshape(x.shape());
  }
  DPAR_PROFILE_SCOPE(act == Activation::none ? "batch_norm" : "batch_norm_act");
  DPAR_CHECK(x.dim() == 4, "batch_norm: expected [N,C], [N,C,L] or [N,C,H,W], got ", x.shape());
  // f16/bf16 on CUDA, bf16 on the CPU: amp::Autocast's activations, normalised in f32 with f32
  // parameters and statistics (as cuDNN's batch norm takes half-precision data), output in the
  // input's dtype.
  DPAR_CHECK(detail::elementwise_dtype_ok(x), "batch_norm: input has dtype ", x.dtype(), " (shape ",
             x.shape(), ") on ", x.device(),
             "; batch_norm supports f32 (and f16/bf16 on CUDA, bf16 on the CPU)");
  const int64_t C = x.size(1);
  DPAR_CHECK(C > 0, "batch_norm: input ", x.shape(), " has no channels");
  check_channel_vector(weight, C, x, "weight");
  check_channel_vector(bias, C, x, "bias");
  check_channel_vector(running_mean, C, x, "running_mean");
  check_channel_vector(running_var, C, x, "running_var");
  DPAR_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: running_mean and running_var must both be given or both be undefined");
  DPAR_CHECK(eps >= 0, "batch_norm: eps must be non-negative, got ", eps);

  // Like PyTorch, eval mode without running statistics normalises with the batch's.
  const bool use_batch_stats = training || !running_mean.defined();
  const int64_t count = x.size(0) * x.size(2) * x.size(3);
  if (use_batch_stats) {
    DPAR_CHECK(count > 1,
               "batch_norm: expected more than 1 value per channel when training, got input ",
               x.shape());
  }

  const Device device = x.device();
  // Keep the input's layout when oneDNN can read it directly; anything else goes channels-last.
  const MemoryFormat format = x.is_contiguous(MemoryFormat::ChannelsLast) || !x.is_contiguous()
                                  ? MemoryFormat::ChannelsLast
                                  : MemoryFormat::Contiguous;
  const Tensor xc = detail::nn_layout_copy(x, format);
  const Tensor wc =
      weight.defined() ? detail::nn_layout_copy(weight, MemoryFormat::Contiguous) : Tensor();
  const Tensor bc =
      bias.defined() ? detail::nn_layout_copy(bias, MemoryFormat::Contiguous) : Tensor();
  const bool grad = autograd::needs_grad({x, weight, bias});
  Tensor mean, var;
  if (use_batch_stats) {
    mean = Tensor::empty({C}, DType::f32, device);
    var = Tensor::empty({C}, DType::f32, device);
  } else if (grad) {
    // Copies, so that a later training step updating the running stats in place cannot change
    // what this step's backward uses.
    mean = running_mean.detach().clone();
    var = running_var.detach().clone();
  } else {
    mean = detail::nn_layout_copy(running_mean.detach(), MemoryFormat::Contiguous);
    var = detail::nn_layout_copy(running_var.detach(), MemoryFormat::Contiguous);
  }
  // The activation in the normalising pass where the backend fuses it (the CPU), else after.
  const bool fused = act != Activation::none && kernels::batch_norm_act_forward.available(device);
  // Where the backend also has the fused backward from the input (the CPU, f32), the backward
  // keeps x, which nothing else reads, and forms y again from it: the forward then writes only
  // z, a pass over one activation less than writing y as well. The memory is the same as
  // keeping y (one activation), and no weight need be invertible.
  const bool act_from_input = fused && grad && xc.dtype() == DType::f32 &&
                              kernels::batch_norm_act_backward.available(device);
  // y is written where something reads it: the unfused activation, or the backward from y.
  const bool write_y = !fused || (grad && !act_from_input);
  Tensor y = write_y ? Tensor::empty_like(xc) : Tensor();
  Tensor z = act == Activation::none ? y : Tensor::empty_like(xc);
  if (xc.numel() > 0) {
    if (fused) {
      kernels::batch_norm_act_forward.get(device)(xc, wc, bc, mean, var, use_batch_stats, eps, act,
                                                  y, z);
    } else {
      kernels::batch_norm_forward.get(device)(xc, wc, bc, mean, var, use_batch_stats, grad, eps, y);
    }
  }
  if (training && running_mean.defined()) {
    kernels::batch_norm_update_stats.get(device)(running_mean, running_var, mean, var, momentum,
                                                 count);
  }
  if (act != Activation::none && !fused) kernels::unary.get(device)(unary_op(act), y, z, {});
  if (!grad) return z;

  // Keep the output rather than the input when the backward can start from it: the activation
  // (fused here, or the module after) or the convolution after a BatchNorm keeps y anyway, so
  // the input x (a whole activation per BatchNorm) is freed right after this forward. That
  // saves about a third of a CNN's training memory (InPlace-ABN's observation). x_hat =
  // (y - bias) / weight needs weights away from zero; otherwise the input is kept as well.
  // Both activations' backward can start from y (ReLU's y <= 0 is its output's z <= 0).
  // The weight check reads the weights on the host: free on the CPU, a synchronisation per
  // layer and step on a GPU, so there the input is kept, as PyTorch always does.
  const bool from_output = !act_from_input && device.is_cpu() && weights_invertible(wc);
  // Where the input is kept, the activation's backward needs its own input y, except ReLU's:
  // its mask (y > 0) is its output's (z > 0), and z is kept by whatever reads it next. So y is
  // freed after this forward, as in PyTorch (BatchNorm keeps x, ReLU its output): on the GPU,
  // which always keeps x, that is one activation less per BatchNorm + ReLU.
  const Tensor act_saved =
      act_from_input ? Tensor() : (!from_output && act == Activation::relu ? z : y);
  const Tensor ws = wc.defined() ? wc.detach() : Tensor();
  const Tensor bs = bc.defined() ? bc.detach() : Tensor();
  const Tensor xs = from_output ? Tensor() : xc.detach();
  autograd::record(
      act == Activation::none ? "batch_norm" : "batch_norm_act", {x, weight, bias}, {z},
      [ys = act_saved.defined() ? act_saved.detach() : Tensor(), xs, act, ws, bs, mean, var,
       use_batch_stats, eps,
       format](const autograd::GradList& grads, const autograd::NeedsGrad& need) {
        // What the backward reads: y, or x where only x is kept (the same shape and layout).
        const Tensor& kept = ys.defined() ? ys : xs;
        Tensor dz =
            detail::cast_for_compute(detail::nn_layout_copy(grads[0], format), kept.dtype());
        Tensor dx = Tensor::empty_like(kept);
        const Shape c{kept.size(1)};
        // The kernels produce the parameter gradients together with dx: allocate all they write.
        Tensor dw = ws.defined() ? Tensor::empty(c, DType::f32, kept.device()) : Tensor();
        Tensor db = bs.defined() ? Tensor::empty(c, DType::f32, kept.device()) : Tensor();
        if (kept.numel() == 0) {  // an empty batch contributes nothing to the parameters
          if (dw.defined()) dw.zero_();
          if (db.defined()) db.zero_();
        } else if (!ys.defined()) {
          // x alone: y and the activation's gradient are formed from it in one kernel.
          kernels::batch_norm_act_backward.get(xs.device())(xs, dz, ws, bs, mean, var,
                                                            use_batch_stats, eps, act, dx, dw, db);
        } else if (!xs.defined()) {
          // One kernel: the activation's gradient is formed on the fly from y.
          kernels::batch_norm_backward_from_output.get(ys.device())(
              ys, dz, ws, bs, var, use_batch_stats, eps, act, dx, dw, db);
        } else {
          Tensor dy = dz;
          if (act != Activation::none) {
            dy = Tensor::empty_like(ys);
            kernels::unary_backward.get(ys.device())(unary_op(act), dz, ys, dy, {});
          }
          kernels::batch_norm_backward.get(ys.device())(xs, dy, ws, bs, mean, var, use_batch_stats,
                                                        eps, dx, dw, db);
        }
        return autograd::GradList{need[0] ? dx : Tensor(), need[1] ? dw : Tensor(),
                                  need[2] ? db : Tensor()};
      });
  // The activation's output can be made again from what the backward above keeps (x, or y):
  // the op that reads z next (a convolution, the SE multiply) keeps this recipe instead of z,
  // so z is freed after the forward (about a third of MobileNetV3's training activations).
  if (act_from_input) {
    // From x, with the forward's statistics as fixed ones: the same affine map and the same
    // loop, so the same bits.
    autograd::set_recompute(z, [xs, ws, bs, mean, var, eps, act] {
      Tensor again = Tensor::empty_like(xs);
      Tensor m = mean, v = var, no_y;
      kernels::batch_norm_act_forward.get(xs.device())(xs, ws, bs, m, v, false, eps, act, no_y,
                                                       again);
      return again;
    });
  } else if (act != Activation::none && act_saved.impl() == y.impl()) {
    autograd::set_recompute(z, [ys = y.detach(), act] {
      Tensor again = Tensor::empty_like(ys);
      kernels::unary.get(ys.device())(unary_op(act), ys, again, {});
      return again;
    });
  }
  return z;
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, double momentum, double eps) {
  return batch_norm_act(x, weight, bias, std::move(running_mean), std::move(running_var), training,
                        momentum, eps, Activation::none);
}

}  // namespace dpar
