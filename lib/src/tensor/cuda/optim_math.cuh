#pragma once
// The per-element optimizer updates, shared by the single-tensor kernels (optim.cu) and the
// multi-tensor ones (optim_multi.cu), so both give bitwise-equal results. The op sequence is the
// CPU kernels' (cpu/optim_kernels.cpp, itself PyTorch's add/addcmul/addcdiv order), and every
// product, sum, quotient and square root is an explicitly rounded intrinsic: nvcc would
// otherwise contract a*b+c into an FMA, which rounds once where the CPU rounds twice, and with
// weight decay nearly cancelling a gradient that one rounding is visible (RMSprop's g/avg
// differed from the CPU by 1e-5 relative on the H100). So the GPU matches the CPU bitwise.
#include "optim/optim_kernels.h"

namespace dpar::cuda {

__device__ __forceinline__ float rn_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float rn_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float rn_div(float a, float b) { return __fdiv_rn(a, b); }

// SGD: returns the new parameter; `buf` (nullptr: no momentum) is read and written.
__device__ __forceinline__ float sgd_update(float p, float g, float* buf,
                                            const kernels::SgdStepArgs& a) {
  float d = g;
  if (a.weight_decay != 0) d = rn_add(d, rn_mul(a.weight_decay, p));
  if (buf) {
    const float b =
        a.first_step ? d : rn_add(rn_mul(*buf, a.momentum), rn_mul(a.one_minus_dampening, d));
    *buf = b;
    d = a.nesterov ? rn_add(d, rn_mul(a.momentum, b)) : b;
  }
  const float neg_lr = -a.lr;
  return rn_add(p, rn_mul(neg_lr, d));
}

// RMSprop: returns the new parameter; `ga` (centered) and `buf` (momentum) are nullptr when
// unused.
__device__ __forceinline__ float rmsprop_update(float p, float g, float& sq, float* ga, float* buf,
                                                const kernels::RmspropStepArgs& a) {
  const float neg_lr = -a.lr;
  if (a.weight_decay != 0) g = rn_add(g, rn_mul(a.weight_decay, p));
  const float v = rn_add(rn_mul(sq, a.alpha), rn_mul(rn_mul(a.one_minus_alpha, g), g));
  sq = v;
  float avg;
  if (ga) {
    const float m = rn_add(rn_mul(*ga, a.alpha), rn_mul(a.one_minus_alpha, g));
    *ga = m;
    avg = __fsqrt_rn(rn_add(v, rn_mul(rn_mul(-1.0f, m), m)));
  } else {
    avg = __fsqrt_rn(v);
  }
  avg = rn_add(avg, a.eps);
  if (buf) {
    const float b = rn_add(rn_mul(*buf, a.momentum), rn_div(g, avg));
    *buf = b;
    return rn_add(p, rn_mul(neg_lr, b));
  }
  return rn_add(p, rn_div(rn_mul(neg_lr, g), avg));
}

// AdamW: returns the new parameter; m and v are the first and second moment estimates.
__device__ __forceinline__ float adamw_update(float p, float g, float& m, float& v,
                                              const kernels::AdamwStepArgs& a) {
  const float neg_step = -a.step_size;
  const float decayed = rn_mul(p, a.decay);
  const float mi = rn_add(rn_mul(m, a.beta1), rn_mul(a.one_minus_beta1, g));
  const float vi = rn_add(rn_mul(v, a.beta2), rn_mul(rn_mul(a.one_minus_beta2, g), g));
  m = mi;
  v = vi;
  const float denom = rn_add(rn_div(__fsqrt_rn(vi), a.bias_correction2_sqrt), a.eps);
  return rn_add(decayed, rn_div(rn_mul(neg_step, mi), denom));
}

}  // namespace dpar::cuda
