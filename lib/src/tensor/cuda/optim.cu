// CUDA kernels for the fused optimizer updates of one parameter: one pass over its memory.
// The per-element math is optim_math.cuh's, shared with the multi-tensor kernels
// (optim_multi.cu). Operands share one dense layout (optim_kernels.h), so every kernel runs
// over numel() flat elements.
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/optim_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/optim_checks.h"
#include "tensor/cuda/optim_math.cuh"
#include "tensor/cuda/strided_indexer.cuh"

namespace dpar::cuda {
namespace {

// b == nullptr: no momentum buffer (plain SGD).
__global__ void sgd_kernel(float* p, const float* g, float* b, int64_t n, kernels::SgdStepArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { p[i] = sgd_update(p[i], g[i], b ? b + i : nullptr, a); }
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
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    p[i] = rmsprop_update(p[i], g[i], sq[i], ga ? ga + i : nullptr, b ? b + i : nullptr, a);
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
  DPAR_CUDA_KERNEL_LOOP(i, n) { p[i] = adamw_update(p[i], g[i], m[i], v[i], a); }
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
