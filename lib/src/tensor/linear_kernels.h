#pragma once
// Kernel slot for dense matrix products (matmul, linear and their gradients).
#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

// c = op(a) * op(b) (+ bias broadcast over rows), where op(t) is t or its transpose.
// a and b are 2-D with any strides; c is a contiguous [M,N] f32 tensor that is overwritten;
// bias is [N] or undefined.
DPAR_KERNEL(gemm, void(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                       const Tensor& bias, Tensor& c));

}  // namespace dpar::kernels
