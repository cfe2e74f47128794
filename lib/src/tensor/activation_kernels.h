#pragma once
// Kernel slots for the pointwise unary ops and activations (forward and backward) and for
// applying a dropout mask.
#include <cstdint>

#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

enum class UnaryOp : uint8_t { exp, log, sqrt, square, relu, hardswish, hardsigmoid, sigmoid };

// out = op(x); same shape, any strides.
DPAR_KERNEL(unary, void(UnaryOp op, const Tensor& x, Tensor& out));
// grad_in = d op / dx * grad. `saved` is what unary_saves_output(op) says the op keeps: the
// forward output for exp/sqrt/relu/sigmoid, the input otherwise. Same shapes, any strides.
DPAR_KERNEL(unary_backward,
            void(UnaryOp op, const Tensor& grad, const Tensor& saved, Tensor& grad_in));
// out = mask ? x * scale : 0, with mask a u8 tensor of x's shape; any strides.
DPAR_KERNEL(masked_scale, void(const Tensor& x, const Tensor& mask, float scale, Tensor& out));

// Whether the backward of op is computed from the forward output (else from the input).
constexpr bool unary_saves_output(UnaryOp op) {
  return op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::relu || op == UnaryOp::sigmoid;
}

}  // namespace dpar::kernels
