#pragma once
// Kernel slots for elementwise arithmetic and reductions over dims.
#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

enum class BinaryOp : uint8_t { add, sub, mul, div };

// out = a (op) b; a and b are already expanded to out's shape (broadcast dims have stride 0).
DPAR_KERNEL(binary, void(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out));
// out = a * alpha + beta (scalar affine map), any layout.
DPAR_KERNEL(affine, void(const Tensor& a, double alpha, double beta, Tensor& out));
// self += alpha * other, shapes equal.
DPAR_KERNEL(add_inplace, void(Tensor& self, const Tensor& other, double alpha));
// out (keepdim shape) = sum of x over the dims where out has size 1 and x does not.
DPAR_KERNEL(sum_to, void(const Tensor& x, Tensor& out));
// out (f32, keepdim shape) = sum_to(a * b) for f32 a and b of one shape, without forming the
// product: the gradient of mul's broadcast operand (the SE block's per-channel scale). An
// optional fast path (KernelSlot::available).
DPAR_KERNEL(mul_sum_to, void(const Tensor& a, const Tensor& b, Tensor& out));

}  // namespace dpar::kernels
