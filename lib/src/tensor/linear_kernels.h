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

// The input gradient of a linear layer, dx = g w (g [M, out], w [out, in]; dx a contiguous
// [M, in], overwritten), and with it, when db ([out]) is defined, the bias gradient: the column
// sums of g in sum_to's fixed blocks (cpu/column_sums.h), so the same result as a separate sum.
// A backend may compute dx a block of g's rows at a time and sum each block while the product
// has it in cache, instead of streaming g once more.
DPAR_KERNEL(linear_input_grad, void(const Tensor& g, const Tensor& w, Tensor& dx, Tensor& db));

// c = a w^T + bias + residual (a [M, in] with any strides, w [out, in], bias [out] or
// undefined, residual a contiguous [M, out]; c a contiguous [M, out], overwritten): a linear
// layer with a residual connection, the residual added as the product is written.
DPAR_KERNEL(linear_residual, void(const Tensor& a, const Tensor& w, const Tensor& bias,
                                  const Tensor& residual, Tensor& c));

}  // namespace dpar::kernels
