#pragma once
// linear's backward, for the fused ops that end in a linear layer's gradient after computing
// their own part (linear_gelu in ops_linear.cpp, projected_self_attention in ops_attention.cpp).
#include "dpar/autograd/function.h"
#include "dpar/tensor/tensor.h"

namespace dpar::detail {

// The gradients of y = x W^T + b (x [M, in], W [out, in]) from G = dL/dy [M, out], in need's
// order (x, W, b), computed in `compute` (f32, or f16/bf16 under autocast on CUDA).
// `summed_bias`, when defined, is the bias gradient already summed by whoever produced G.
autograd::GradList linear_backward(const Tensor& g, const Tensor& x, const Tensor& w,
                                   const autograd::NeedsGrad& need, DType compute,
                                   const Tensor& summed_bias = {});

}  // namespace dpar::detail
