#pragma once
// Kernel slot of the loss scaler (dpar/optim/grad_scaler.h): unscaling a gradient and checking
// it for inf/nan in one pass over its memory, as PyTorch's
// _amp_foreach_non_finite_check_and_unscale_. It sits beside optim_kernels.h because only the
// scaler, an optimizer-side helper, calls it.
#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

// grad *= inv_scale in place; grad is a dense f32 tensor, treated as numel() flat elements.
// When any result is inf or nan the kernel writes 1.0f into found_inf, a one-element f32
// tensor on grad's device, and it never clears it: one flag collects every gradient of a step.
// The flag lives on the gradient's device so that the CUDA kernel only enqueues work on the
// current stream; nothing synchronises per gradient, and the scaler reads the flag once per
// step.
DPAR_KERNEL(unscale_and_check_finite, void(Tensor& grad, float inv_scale, Tensor& found_inf));

}  // namespace dpar::kernels
