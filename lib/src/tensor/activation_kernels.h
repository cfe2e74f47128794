#pragma once
// Kernel slots for the pointwise unary ops and activations (forward and backward) and for
// applying a dropout mask.
#include <cstdint>

#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

enum class UnaryOp : uint8_t {
  exp,
  log,
  sqrt,
  square,
  relu,
  hardswish,
  hardsigmoid,
  sigmoid,
  tanh,
  gelu,       // exact: x * Phi(x), Phi the normal CDF (erf)
  gelu_tanh,  // PyTorch's approximate="tanh"
  silu,
  softplus,    // a = beta, b = threshold
  leaky_relu,  // a = negative slope
  abs,
  clamp,  // a = min, b = max (+-inf for a missing bound)
  pow,    // a = exponent
  erf,
};

// The scalar parameters of the ops that have them (see UnaryOp); ignored by the others.
struct UnaryArgs {
  float a = 0.f;
  float b = 0.f;
  // A hint for the forward: out is a training activation, written to memory that the last
  // backward freed (long out of cache) and, when larger than a core's L2, not read back from
  // cache either. The CPU may then write it with streaming stores, which skip reading each line
  // before overwriting it. The values are the same; backends may ignore it.
  bool stream_output = false;
};

// out = op(x); same shape, any strides.
DPAR_KERNEL(unary, void(UnaryOp op, const Tensor& x, Tensor& out, UnaryArgs args));
// grad_in = d op / dx * grad. `saved` is what unary_saves_output(op) says the op keeps: the
// forward output for exp/sqrt/relu/sigmoid/tanh, the input otherwise. Same shapes, any strides.
DPAR_KERNEL(unary_backward, void(UnaryOp op, const Tensor& grad, const Tensor& saved,
                                 Tensor& grad_in, UnaryArgs args));
// out = mask ? x * scale : 0, with mask a u8 tensor of x's shape; any strides.
DPAR_KERNEL(masked_scale, void(const Tensor& x, const Tensor& mask, float scale, Tensor& out));

// Whether the backward of op is computed from the forward output (else from the input).
constexpr bool unary_saves_output(UnaryOp op) {
  return op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::relu ||
         op == UnaryOp::sigmoid || op == UnaryOp::tanh;
}

}  // namespace dpar::kernels
