#pragma once
// Kernel slots for softmax / log_softmax, fused cross-entropy and index selection.
#include <cstdint>

#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

// out = (log_)softmax of x along dim; x and out have equal shapes and equal strides.
DPAR_KERNEL(softmax, void(const Tensor& x, int64_t dim, bool log, Tensor& out));
// grad_in from grad and the forward output y; all three share y's shape and strides.
DPAR_KERNEL(softmax_backward,
            void(const Tensor& grad, const Tensor& y, int64_t dim, bool log, Tensor& grad_in));
// Mean label-smoothed cross-entropy of logits [N,K] (any strides) against target i64 [N].
// Writes the loss into the one-element `loss`; when grad is defined (contiguous [N,K]) also
// writes d loss / d logits there. Throws dpar::Error for targets outside [0,K).
DPAR_KERNEL(cross_entropy, void(const Tensor& logits, const Tensor& target, double label_smoothing,
                                Tensor& loss, Tensor& grad));
// out (i64, x's shape without dim) = index of the first maximum of x along dim.
DPAR_KERNEL(argmax, void(const Tensor& x, int64_t dim, Tensor& out));
// out (i64 [N,k], contiguous) = indices of the k largest entries of each row of x [N,K],
// largest first, equal values by lower index.
DPAR_KERNEL(topk_indices, void(const Tensor& x, int64_t k, Tensor& out));

}  // namespace dpar::kernels
