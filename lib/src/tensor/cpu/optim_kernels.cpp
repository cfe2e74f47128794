// CPU kernels for the fused optimizer updates: one pass over each parameter's memory, split
// over OpenMP threads for large tensors (elementwise, so the split does not change results).
// The arithmetic follows PyTorch's op sequence (add with alpha, addcmul, addcdiv) so that
// each intermediate is rounded to float the same way.
#include "optim/optim_kernels.h"

#include <cmath>

#include "tensor/cpu/isa.h"

namespace dpar::cpu {
namespace {

// Below this many elements the thread start-up costs more than the update itself.
constexpr int64_t kParallelThreshold = 32768;

float* f32(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

void sgd_step_cpu(Tensor& param, const Tensor& grad, Tensor& momentum_buffer,
                  const kernels::SgdStepArgs& a) {
  const int64_t n = param.numel();
  float* p = f32(param);
  const float* g = f32(grad);
  const float neg_lr = -a.lr;
  if (!momentum_buffer.defined()) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i];
      if (a.weight_decay != 0) d = d + a.weight_decay * p[i];
      p[i] = p[i] + neg_lr * d;
    }
    return;
  }
  float* b = f32(momentum_buffer);
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (a.weight_decay != 0) d = d + a.weight_decay * p[i];
    const float buf = a.first_step ? d : b[i] * a.momentum + a.one_minus_dampening * d;
    b[i] = buf;
    d = a.nesterov ? d + a.momentum * buf : buf;
    p[i] = p[i] + neg_lr * d;
  }
}

void rmsprop_step_cpu(Tensor& param, const Tensor& grad, Tensor& square_avg, Tensor& grad_avg,
                      Tensor& momentum_buffer, const kernels::RmspropStepArgs& a) {
  const int64_t n = param.numel();
  float* p = f32(param);
  const float* g = f32(grad);
  float* sq = f32(square_avg);
  float* ga = grad_avg.defined() ? f32(grad_avg) : nullptr;
  float* b = momentum_buffer.defined() ? f32(momentum_buffer) : nullptr;
  const float neg_lr = -a.lr;
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (a.weight_decay != 0) gi = gi + a.weight_decay * p[i];
    const float v = sq[i] * a.alpha + a.one_minus_alpha * gi * gi;
    sq[i] = v;
    float avg;
    if (ga) {
      const float m = ga[i] * a.alpha + a.one_minus_alpha * gi;
      ga[i] = m;
      avg = std::sqrt(v + -1.0f * m * m);
    } else {
      avg = std::sqrt(v);
    }
    avg = avg + a.eps;
    if (b) {
      const float buf = b[i] * a.momentum + gi / avg;
      b[i] = buf;
      p[i] = p[i] + neg_lr * buf;
    } else {
      p[i] = p[i] + neg_lr * gi / avg;
    }
  }
}

// The AdamW update once per ISA (cpu/isa.h): its square root and divisions make it compute
// bound at 4 lanes (ViT-Tiny's step spent ~10 ms in it on one core). Every operation is IEEE
// exactly rounded, so all clones give the same bits.
// clang-format off
#define DPAR_ADAMW_LOOP(SUFFIX, TARGET)                                                      \
  TARGET void adamw_loop##SUFFIX(float* p, const float* g, float* m, float* v, int64_t n,  \
                                 const kernels::AdamwStepArgs& a) {                        \
    const float neg_step = -a.step_size;                                                   \
    _Pragma("omp parallel for schedule(static) if (n > kParallelThreshold)")               \
    for (int64_t i = 0; i < n; ++i) {                                                      \
      const float gi = g[i];                                                               \
      const float pi = p[i] * a.decay;                                                     \
      const float mi = m[i] * a.beta1 + a.one_minus_beta1 * gi;                            \
      const float vi = v[i] * a.beta2 + a.one_minus_beta2 * gi * gi;                       \
      m[i] = mi;                                                                           \
      v[i] = vi;                                                                           \
      const float denom = std::sqrt(vi) / a.bias_correction2_sqrt + a.eps;                 \
      p[i] = pi + neg_step * mi / denom;                                                   \
    }                                                                                      \
  }
DPAR_ADAMW_LOOP(_baseline, )
DPAR_ADAMW_LOOP(_avx2, DPAR_TARGET_AVX2)
DPAR_ADAMW_LOOP(_avx512, DPAR_TARGET_AVX512)
// clang-format on
#undef DPAR_ADAMW_LOOP

void adamw_step_cpu(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                    const kernels::AdamwStepArgs& a) {
  float* p = f32(param);
  const float* g = f32(grad);
  float* m = f32(exp_avg);
  float* v = f32(exp_avg_sq);
  const int64_t n = param.numel();
  switch (cpu_isa()) {
    case Isa::avx512:
      return adamw_loop_avx512(p, g, m, v, n, a);
    case Isa::avx2:
      return adamw_loop_avx2(p, g, m, v, n, a);
    case Isa::baseline:
      break;
  }
  adamw_loop_baseline(p, g, m, v, n, a);
}

}  // namespace

void register_optim_kernels() {
  kernels::sgd_step.set(DeviceType::CPU, sgd_step_cpu);
  kernels::rmsprop_step.set(DeviceType::CPU, rmsprop_step_cpu);
  kernels::adamw_step.set(DeviceType::CPU, adamw_step_cpu);
}

}  // namespace dpar::cpu
