// CUDA global average pooling over contiguous NCHW or channels-last NHWC inputs, f32 or f16/bf16
// (summed in f32, the input's dtype out: amp::Autocast's half-precision activations); the
// layout is read from the strides as the CPU backend does (channels-last checked first).
#include <algorithm>
#include <cstdint>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/float_types.cuh"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/nn_kernels.h"

namespace dpar::cuda {
namespace {

constexpr int kWarp = 32;

// NCHW: one warp per (n, c) plane so that the lanes read the plane's contiguous memory together.
// The plane loop depends on the warp index only, so all 32 lanes reach the shuffles.
template <class T>
__global__ void gap_forward_nchw_kernel(const T* x, T* y, int64_t planes, int64_t C, int64_t HW,
                                        int64_t y_sn, int64_t y_sc, float scale) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t nc = warp; nc < planes; nc += warps) {
    const T* plane = x + nc * HW;
    float s = 0.0f;
    for (int64_t p = lane; p < HW; p += kWarp) s += to_float(plane[p]);
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      s += __shfl_down_sync(0xffffffffu, s, offset);
    }
    if (lane == 0) y[(nc / C) * y_sn + (nc % C) * y_sc] = from_float<T>(s * scale);
  }
}

// NHWC: block (n, tile of 32 channels), threads (x: channel, y: one of kLanes pixel lanes), so
// that a warp reads 32 neighbouring channels of one pixel and each (n, c) has kLanes threads in
// flight. Lane y sums pixels y, y + kLanes, ... in order; the lanes are then added in order, a
// fixed order for a given shape. (A thread per (n, c) walking all HW pixels left most of an
// H100 idle: 50 us for an SE block's squeeze.)
constexpr int kGapLanes = kThreads / kWarp;

template <class T>
__global__ void gap_forward_nhwc_kernel(const T* x, T* y, int64_t N, int64_t C, int64_t HW,
                                        int64_t y_sn, int64_t y_sc, float scale) {
  __shared__ float lane_sums[kGapLanes][kWarp];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kWarp) + threadIdx.x;
  // The sample loop depends on the block only, so every thread reaches each __syncthreads.
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float s = 0.0f;
    if (c < C) {
      const T* xc = x + n * HW * C + c;
      for (int64_t p = threadIdx.y; p < HW; p += kGapLanes) s += to_float(xc[p * C]);
    }
    lane_sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
      for (int l = 1; l < kGapLanes; ++l) s += lane_sums[l][threadIdx.x];
      y[n * y_sn + c * y_sc] = from_float<T>(s * scale);
    }
    __syncthreads();  // lane_sums is rewritten for the next sample
  }
}

void global_avg_pool2d_forward_cuda(const Tensor& x, Tensor& y) {
  DeviceGuard guard(x.device());
  require_same_float("global_avg_pool2d_forward", x, y, "y");
  DPAR_CHECK(x.dim() == 4 && y.dim() == 4,
             "global_avg_pool2d_forward on CUDA: expected 4-D x and "
             "y, got ",
             x.shape(), " and ", y.shape());
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  if (y.numel() == 0) return;
  DPAR_CHECK(HW > 0, "global_avg_pool2d_forward on CUDA: empty spatial dims in ", x.shape());
  const float scale = 1.0f / static_cast<float>(HW);
  const bool nhwc = x.is_contiguous(MemoryFormat::ChannelsLast);
  DPAR_CHECK(nhwc || x.is_contiguous(),
             "global_avg_pool2d_forward on CUDA needs a contiguous or channels-last input, got "
             "strides ",
             x.strides());
  visit_float_dtype(x.dtype(), "global_avg_pool2d_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = data_as<T>(x);
    T* py = data_as<T>(y);
    if (nhwc) {
      const dim3 grid(static_cast<unsigned>((C + kWarp - 1) / kWarp),
                      static_cast<unsigned>(std::min<int64_t>(N, 65535)));
      gap_forward_nhwc_kernel<<<grid, dim3(kWarp, kGapLanes), 0, current_stream()>>>(
          px, py, N, C, HW, y.stride(0), y.stride(1), scale);
    } else {
      gap_forward_nchw_kernel<<<blocks_for(N * C * kWarp), kThreads, 0, current_stream()>>>(
          px, py, N * C, C, HW, y.stride(0), y.stride(1), scale);
    }
  });
  check_launch("global_avg_pool2d_forward");
}

template <class T>
__global__ void gap_backward_nchw_kernel(const T* dy, T* dx, int64_t n_total, int64_t C, int64_t HW,
                                         int64_t dy_sn, int64_t dy_sc, float scale) {
  DPAR_CUDA_KERNEL_LOOP(i, n_total) {
    const int64_t nc = i / HW;
    dx[i] = from_float<T>(to_float(dy[(nc / C) * dy_sn + (nc % C) * dy_sc]) * scale);
  }
}

// Idx is uint32_t where the tensor allows it: 64-bit division was most of this kernel's time.
template <class Idx, class T>
__global__ void gap_backward_nhwc_kernel(const T* dy, T* dx, Idx n_total, Idx C, Idx HWC,
                                         int64_t dy_sn, int64_t dy_sc, float scale) {
  for (Idx i = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Idx>(blockDim.x) * gridDim.x) {
    const Idx n = i / HWC, c = i % C;
    dx[i] = from_float<T>(to_float(dy[n * dy_sn + c * dy_sc]) * scale);
  }
}

void global_avg_pool2d_backward_cuda(const Tensor& dy, Tensor& dx) {
  DeviceGuard guard(dx.device());
  require_same_float("global_avg_pool2d_backward", dx, dy, "dy");
  DPAR_CHECK(dx.dim() == 4 && dy.dim() == 4,
             "global_avg_pool2d_backward on CUDA: expected 4-D dy "
             "and dx, got ",
             dy.shape(), " and ", dx.shape());
  const int64_t n_total = dx.numel();
  if (n_total == 0) return;
  const int64_t C = dx.size(1), HW = dx.size(2) * dx.size(3);
  const float scale = 1.0f / static_cast<float>(HW);
  const bool nhwc = dx.is_contiguous(MemoryFormat::ChannelsLast);
  DPAR_CHECK(nhwc || dx.is_contiguous(),
             "global_avg_pool2d_backward on CUDA needs a contiguous or channels-last dx, got "
             "strides ",
             dx.strides());
  visit_float_dtype(dx.dtype(), "global_avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = data_as<T>(dy);
    T* px = data_as<T>(dx);
    if (nhwc && n_total <= INT32_MAX) {
      gap_backward_nhwc_kernel<uint32_t, T><<<blocks_for(n_total), kThreads, 0, current_stream()>>>(
          pg, px, static_cast<uint32_t>(n_total), static_cast<uint32_t>(C),
          static_cast<uint32_t>(HW * C), dy.stride(0), dy.stride(1), scale);
    } else if (nhwc) {
      gap_backward_nhwc_kernel<int64_t, T><<<blocks_for(n_total), kThreads, 0, current_stream()>>>(
          pg, px, n_total, C, HW * C, dy.stride(0), dy.stride(1), scale);
    } else {
      gap_backward_nchw_kernel<<<blocks_for(n_total), kThreads, 0, current_stream()>>>(
          pg, px, n_total, C, HW, dy.stride(0), dy.stride(1), scale);
    }
  });
  check_launch("global_avg_pool2d_backward");
}

}  // namespace

void register_pool_kernels() {
  kernels::global_avg_pool2d_forward.set(DeviceType::CUDA, &global_avg_pool2d_forward_cuda);
  kernels::global_avg_pool2d_backward.set(DeviceType::CUDA, &global_avg_pool2d_backward_cuda);
}

}  // namespace dpar::cuda
