// CUDA layer normalisation over rows of a contiguous [R, D] matrix: one block per row for the
// row statistics and dx (block reductions in a fixed order), one thread per column for
// dweight / dbias (rows summed in order): results do not change from run to run.
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/layer_norm_kernels.h"

namespace dpar::cuda {
namespace {

constexpr int kRowThreads = 256;

// Sum over the block (kRowThreads threads), the same value returned to every thread.
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from the previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kRowThreads / 32; ++w) total += scratch[w];
  return total;
}

__global__ void layer_norm_forward_kernel(const float* x, const float* w, const float* b, float eps,
                                          int64_t d, float* y, float* mean, float* rstd) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * d;
  float* yr = y + r * d;
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
  const float mu = block_sum(s, scratch) / static_cast<float>(d);
  float v = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) v += (xr[j] - mu) * (xr[j] - mu);
  const float rs = rsqrtf(block_sum(v, scratch) / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float out = (xr[j] - mu) * rs;
    if (w) out *= w[j];
    if (b) out += b[j];
    yr[j] = out;
  }
}

__global__ void layer_norm_dx_kernel(const float* x, const float* dy, const float* w,
                                     const float* mean, const float* rstd, int64_t d, float* dx) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * d;
  const float* gr = dy + r * d;
  const float mu = mean[r], rs = rstd[r];
  float sg = 0.f, sgx = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = w ? gr[j] * w[j] : gr[j];
    sg += g;
    sgx += g * (xr[j] - mu);
  }
  const float mean_g = block_sum(sg, scratch) / static_cast<float>(d);
  const float mean_gx = block_sum(sgx, scratch) * rs / static_cast<float>(d);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = w ? gr[j] * w[j] : gr[j];
    dx[r * d + j] = rs * (g - mean_g - (xr[j] - mu) * rs * mean_gx);
  }
}

__global__ void layer_norm_params_kernel(const float* x, const float* dy, const float* mean,
                                         const float* rstd, int64_t rows, int64_t d, float* dw,
                                         float* db) {
  DPAR_CUDA_KERNEL_LOOP(j, d) {
    float aw = 0.f, ab = 0.f;
    for (int64_t r = 0; r < rows; ++r) {
      const float g = dy[r * d + j];
      aw += g * (x[r * d + j] - mean[r]) * rstd[r];
      ab += g;
    }
    if (dw) dw[j] = aw;
    if (db) db[j] = ab;
  }
}

const float* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const float*>(t.raw_data()) : nullptr;
}

void layer_norm_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             Tensor& y, Tensor& mean, Tensor& rstd) {
  DeviceGuard guard(x.device());
  const int64_t rows = x.size(0), d = x.size(1);
  if (rows == 0) return;
  layer_norm_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, current_stream()>>>(
      static_cast<const float*>(x.raw_data()), ptr_or_null(weight), ptr_or_null(bias),
      static_cast<float>(eps), d, static_cast<float*>(y.raw_data()),
      static_cast<float*>(mean.raw_data()), static_cast<float*>(rstd.raw_data()));
  check_launch("layer_norm_forward");
}

void layer_norm_backward_cuda(const Tensor& x, const Tensor& dy, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                              Tensor& dbias, bool accumulate_dx) {
  DPAR_CHECK(!accumulate_dx, "layer_norm backward: the CUDA kernel writes dx, it does not add");
  DeviceGuard guard(x.device());
  const int64_t rows = x.size(0), d = x.size(1);
  const auto* px = static_cast<const float*>(x.raw_data());
  const auto* pdy = static_cast<const float*>(dy.raw_data());
  const auto* pm = static_cast<const float*>(mean.raw_data());
  const auto* pr = static_cast<const float*>(rstd.raw_data());
  if (dx.defined() && rows > 0) {
    layer_norm_dx_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, current_stream()>>>(
        px, pdy, ptr_or_null(weight), pm, pr, d, static_cast<float*>(dx.raw_data()));
    check_launch("layer_norm_backward");
  }
  if ((dweight.defined() || dbias.defined()) && d > 0) {
    layer_norm_params_kernel<<<blocks_for(d), kThreads, 0, current_stream()>>>(
        px, pdy, pm, pr, rows, d,
        dweight.defined() ? static_cast<float*>(dweight.raw_data()) : nullptr,
        dbias.defined() ? static_cast<float*>(dbias.raw_data()) : nullptr);
    check_launch("layer_norm_backward (weight and bias)");
  }
}

}  // namespace

void register_layer_norm_kernels() {
  kernels::layer_norm_forward.set(DeviceType::CUDA, &layer_norm_forward_cuda);
  kernels::layer_norm_backward.set(DeviceType::CUDA, &layer_norm_backward_cuda);
}

}  // namespace dpar::cuda
