#pragma once
// Kernel slots for layer normalisation over the last D elements of each row (LayerNorm, and
// GroupNorm through it: a group is one row). x is a contiguous [R, D] f32 matrix.
#include <cstdint>

#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

// y = (x - mean) * rstd (* weight + bias), per row; mean and rstd ([R], contiguous) receive
// each row's mean and 1 / sqrt(biased variance + eps) for the backward. weight and bias are
// contiguous [D] or undefined (each independently).
DPAR_KERNEL(layer_norm_forward, void(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     double eps, Tensor& y, Tensor& mean, Tensor& rstd));
// dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * weight (dy without weight),
// per row; dweight = sum over rows of dy * x_hat and dbias = sum of dy, each computed when
// defined (allocated [D] by the caller). dy is contiguous [R, D]. Sums over rows run in a fixed
// order: the same bits for any thread count. With accumulate_dx, dx holds a gradient already
// and receives dx + that value (the same bits as adding the two afterwards); only the CPU
// kernel accumulates (the op asks nothing else to).
DPAR_KERNEL(layer_norm_backward, void(const Tensor& x, const Tensor& dy, const Tensor& weight,
                                      const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                      Tensor& dweight, Tensor& dbias, bool accumulate_dx));

}  // namespace dpar::kernels
