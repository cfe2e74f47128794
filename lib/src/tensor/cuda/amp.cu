// CUDA kernel of the loss scaler: unscale a gradient and detect inf/nan in one pass. The
// found-inf flag is an f32 on the device (PyTorch's found_inf): the kernel is only enqueued on
// the current stream, so unscaling every gradient of a step never waits for the GPU; the scaler
// reads the flag once per step. Same arithmetic as cpu/amp_kernels.cpp (one f32 product per
// element), so results are bit-equal.
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/amp_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/strided_indexer.cuh"

namespace dpar::cuda {
namespace {

__global__ void unscale_and_check_finite_kernel(float* g, float inv_scale, float* found_inf,
                                                int64_t n) {
  bool bad = false;
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    const float y = g[i] * inv_scale;
    g[i] = y;
    bad |= !isfinite(y);
  }
  // Every writer stores the same value and nobody reads the flag during the kernel, so plain
  // stores race harmlessly; no atomics, and a flag already set by an earlier gradient stays set.
  if (bad) *found_inf = 1.0f;
}

void unscale_and_check_finite_cuda(Tensor& grad, float inv_scale, Tensor& found_inf) {
  DeviceGuard guard(grad.device());
  DPAR_CHECK(grad.dtype() == DType::f32 && grad.is_dense(),
             "unscale_and_check_finite on CUDA needs a dense f32 gradient, got ", grad.str(),
             " strides ", grad.strides());
  DPAR_CHECK(found_inf.dtype() == DType::f32 && found_inf.numel() == 1 &&
                 found_inf.device() == grad.device(),
             "unscale_and_check_finite on CUDA: found_inf must be a one-element f32 tensor on ",
             grad.device(), ", got ", found_inf.str());
  const int64_t n = grad.numel();
  if (n == 0) return;
  unscale_and_check_finite_kernel<<<blocks_for(n), kThreads, 0,
                                    current_stream(grad.device().index)>>>(
      static_cast<float*>(grad.raw_data()), inv_scale, static_cast<float*>(found_inf.raw_data()),
      n);
  check_launch("unscale_and_check_finite");
}

}  // namespace

void register_amp_kernels() {
  kernels::unscale_and_check_finite.set(DeviceType::CUDA, &unscale_and_check_finite_cuda);
}

}  // namespace dpar::cuda
