// CUDA kernels for the fused optimizer updates: one pass over each parameter's memory, with
// the CPU kernels' op sequence (cpu/optim_kernels.cpp, itself PyTorch's add/addcmul/addcdiv
// order), so each intermediate is rounded to float at the same place. Operands share one
// dense layout (optim_kernels.h), so every kernel runs over numel() flat elements.
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/optim_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/strided_indexer.cuh"

namespace dpar::cuda {
namespace {

// Same memory order as param: equal strides wherever the size is not 1 (a size-1 dim's stride
// does not move any element).
bool same_layout(const Tensor& t, const Tensor& param) {
  if (t.shape() != param.shape()) return false;
  for (size_t d = 0; d < t.shape().size(); ++d) {
    if (t.shape()[d] != 1 && t.strides()[d] != param.strides()[d]) return false;
  }
  return true;
}

// Operand `t` of `op` must be an f32 tensor laid out like param.
void check_operand(const Tensor& t, const Tensor& param, const char* op, const char* name) {
  DPAR_CHECK(t.dtype() == DType::f32 && t.device() == param.device() && same_layout(t, param), op,
             " on CUDA: ", name, " must be f32 with param's shape ", param.shape(), ", strides ",
             param.strides(), " and device ", param.device(), "; got ", t.str(), " strides ",
             t.strides());
}

void check_param(const Tensor& param, const char* op) {
  DPAR_CHECK(param.dtype() == DType::f32 && param.is_dense(), op,
             " on CUDA needs a dense f32 parameter, got ", param.str(), " strides ",
             param.strides());
}

float* f32(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

// b == nullptr: no momentum buffer (plain SGD).
__global__ void sgd_kernel(float* p, const float* g, float* b, int64_t n, kernels::SgdStepArgs a) {
  const float neg_lr = -a.lr;
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    float d = g[i];
    if (a.weight_decay != 0) d = d + a.weight_decay * p[i];
    if (b) {
      const float buf = a.first_step ? d : b[i] * a.momentum + a.one_minus_dampening * d;
      b[i] = buf;
      d = a.nesterov ? d + a.momentum * buf : buf;
    }
    p[i] = p[i] + neg_lr * d;
  }
}

void sgd_step_cuda(Tensor& param, const Tensor& grad, Tensor& momentum_buffer,
                   const kernels::SgdStepArgs& args) {
  DeviceGuard guard(param.device());
  check_param(param, "sgd_step");
  check_operand(grad, param, "sgd_step", "grad");
  if (momentum_buffer.defined()) {
    check_operand(momentum_buffer, param, "sgd_step", "momentum_buffer");
  }
  const int64_t n = param.numel();
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, current_stream(param.device().index)>>>(
      f32(param), f32(grad), momentum_buffer.defined() ? f32(momentum_buffer) : nullptr, n, args);
  check_launch("sgd_step");
}

// ga (centered) and b (momentum) are nullptr when unused.
__global__ void rmsprop_kernel(float* p, const float* g, float* sq, float* ga, float* b, int64_t n,
                               kernels::RmspropStepArgs a) {
  const float neg_lr = -a.lr;
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    float gi = g[i];
    if (a.weight_decay != 0) gi = gi + a.weight_decay * p[i];
    const float v = sq[i] * a.alpha + a.one_minus_alpha * gi * gi;
    sq[i] = v;
    float avg;
    if (ga) {
      const float m = ga[i] * a.alpha + a.one_minus_alpha * gi;
      ga[i] = m;
      avg = sqrtf(v + -1.0f * m * m);
    } else {
      avg = sqrtf(v);
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

void rmsprop_step_cuda(Tensor& param, const Tensor& grad, Tensor& square_avg, Tensor& grad_avg,
                       Tensor& momentum_buffer, const kernels::RmspropStepArgs& args) {
  DeviceGuard guard(param.device());
  check_param(param, "rmsprop_step");
  check_operand(grad, param, "rmsprop_step", "grad");
  check_operand(square_avg, param, "rmsprop_step", "square_avg");
  if (grad_avg.defined()) check_operand(grad_avg, param, "rmsprop_step", "grad_avg");
  if (momentum_buffer.defined()) {
    check_operand(momentum_buffer, param, "rmsprop_step", "momentum_buffer");
  }
  const int64_t n = param.numel();
  if (n == 0) return;
  rmsprop_kernel<<<blocks_for(n), kThreads, 0, current_stream(param.device().index)>>>(
      f32(param), f32(grad), f32(square_avg), grad_avg.defined() ? f32(grad_avg) : nullptr,
      momentum_buffer.defined() ? f32(momentum_buffer) : nullptr, n, args);
  check_launch("rmsprop_step");
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             kernels::AdamwStepArgs a) {
  const float neg_step = -a.step_size;
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    const float gi = g[i];
    const float pi = p[i] * a.decay;
    const float mi = m[i] * a.beta1 + a.one_minus_beta1 * gi;
    const float vi = v[i] * a.beta2 + a.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / a.bias_correction2_sqrt + a.eps;
    p[i] = pi + neg_step * mi / denom;
  }
}

void adamw_step_cuda(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                     const kernels::AdamwStepArgs& args) {
  DeviceGuard guard(param.device());
  check_param(param, "adamw_step");
  check_operand(grad, param, "adamw_step", "grad");
  check_operand(exp_avg, param, "adamw_step", "exp_avg");
  check_operand(exp_avg_sq, param, "adamw_step", "exp_avg_sq");
  const int64_t n = param.numel();
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, current_stream(param.device().index)>>>(
      f32(param), f32(grad), f32(exp_avg), f32(exp_avg_sq), n, args);
  check_launch("adamw_step");
}

}  // namespace

void register_optim_kernels() {
  kernels::sgd_step.set(DeviceType::CUDA, &sgd_step_cuda);
  kernels::rmsprop_step.set(DeviceType::CUDA, &rmsprop_step_cuda);
  kernels::adamw_step.set(DeviceType::CUDA, &adamw_step_cuda);
}

}  // namespace dpar::cuda
