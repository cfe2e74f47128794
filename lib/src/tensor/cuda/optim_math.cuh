#pragma once
// The per-element optimizer updates, shared by the single-tensor kernels (optim.cu) and the
// multi-tensor ones (optim_multi.cu). Both must give bitwise-equal results, and nvcc contracts
// a*b+c into an FMA wherever it sees one, so the arithmetic lives here once: each caller loads
// the operands, calls one of these and stores, and every rounding (and FMA) happens inside.
// The op sequence is the CPU kernels' (cpu/optim_kernels.cpp, itself PyTorch's
// add/addcmul/addcdiv order), so each intermediate is rounded to float at the same place.
#include "optim/optim_kernels.h"

namespace dpar::cuda {

// SGD: returns the new parameter; `buf` (nullptr: no momentum) is read and written.
__device__ __forceinline__ float sgd_update(float p, float g, float* buf,
                                            const kernels::SgdStepArgs& a) {
  float d = g;
  if (a.weight_decay != 0) d = d + a.weight_decay * p;
  if (buf) {
    const float b = a.first_step ? d : *buf * a.momentum + a.one_minus_dampening * d;
    *buf = b;
    d = a.nesterov ? d + a.momentum * b : b;
  }
  const float neg_lr = -a.lr;
  return p + neg_lr * d;
}

// RMSprop: returns the new parameter; `ga` (centered) and `buf` (momentum) are nullptr when
// unused.
__device__ __forceinline__ float rmsprop_update(float p, float g, float& sq, float* ga, float* buf,
                                                const kernels::RmspropStepArgs& a) {
  const float neg_lr = -a.lr;
  if (a.weight_decay != 0) g = g + a.weight_decay * p;
  const float v = sq * a.alpha + a.one_minus_alpha * g * g;
  sq = v;
  float avg;
  if (ga) {
    const float m = *ga * a.alpha + a.one_minus_alpha * g;
    *ga = m;
    avg = sqrtf(v + -1.0f * m * m);
  } else {
    avg = sqrtf(v);
  }
  avg = avg + a.eps;
  if (buf) {
    const float b = *buf * a.momentum + g / avg;
    *buf = b;
    return p + neg_lr * b;
  }
  return p + neg_lr * g / avg;
}

// AdamW: returns the new parameter; m and v are the first and second moment estimates.
__device__ __forceinline__ float adamw_update(float p, float g, float& m, float& v,
                                              const kernels::AdamwStepArgs& a) {
  const float neg_step = -a.step_size;
  const float decayed = p * a.decay;
  const float mi = m * a.beta1 + a.one_minus_beta1 * g;
  const float vi = v * a.beta2 + a.one_minus_beta2 * g * g;
  m = mi;
  v = vi;
  const float denom = sqrtf(vi) / a.bias_correction2_sqrt + a.eps;
  return decayed + neg_step * mi / denom;
}

}  // namespace dpar::cuda
