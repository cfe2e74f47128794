#pragma once
// Kernel slots for scaled dot-product attention fused into one op: for every (batch, head)
// slice, S = scale * Q K^T (+ mask, causal), P = softmax(S) by rows, O = P V, and the
// backward from the kept P. A backend without these slots (CUDA) runs the same maths as a
// chain of ops (ops_attention.cpp).
#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

// Every q, k, v, out, dout, dq, dk, dv is a 4-D f32 tensor [N, H, L, D] with unit stride along
// D and any other strides (so q, k and v may be views into one packed [N, L, 3, H, D] product
// and out a view of a token-major [N, L, H, D] buffer, with no copies); slice b = n * H + h.
// mask: additive f32 [N*H, Lq, Lk] contiguous (0 or -inf from a boolean mask) or undefined;
// causal: query i sees keys j <= i (top-left aligned, as torch's is_causal). Writes out and
// probs [N*H, Lq, Lk] contiguous (the softmax, kept for the backward). A row with no visible
// key gives NaN, as in torch.
DPAR_KERNEL(sdpa_forward,
            void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                 float scale, Tensor& out, Tensor& probs));
// dq, dk, dv (overwritten) from dout, the forward's probs and out.
DPAR_KERNEL(sdpa_backward, void(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& probs, const Tensor& out, const Tensor& dout,
                                float scale, Tensor& dq, Tensor& dk, Tensor& dv));

}  // namespace dpar::kernels
