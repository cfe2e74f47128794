#pragma once
// Max, average and adaptive average pooling over k x k windows: the geometry, the window of
// each output position (the same formulas on the CPU and in CUDA kernels: host/device
// callable), and the kernel slots.
#include <cstdint>

#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

#ifdef __CUDACC__
#define DPAR_POOL_HD __host__ __device__ __forceinline__
#else
#define DPAR_POOL_HD inline
#endif

namespace dpar::kernels {

enum class PoolKind : uint8_t { max, avg, adaptive_avg };

// Input [N,C,H,W] -> output [N,C,OH,OW].
struct PoolGeometry {
  PoolKind kind = PoolKind::max;
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  bool count_include_pad = true;  // avg: padded positions count in the divisor
};

// The input rows (or columns) [begin, end) that output position i of a dim reads, and the
// count the average divides by. torch's formulas: a regular window starts at i*stride - pad
// and spans kernel positions, clipped to the input (the divisor keeps the padded ones when
// count_include_pad, clipped to the padded size for ceil-mode windows); an adaptive window is
// [floor(i*size/out), ceil((i+1)*size/out)).
struct PoolWindow {
  int64_t begin, end, divisor;
};

DPAR_POOL_HD PoolWindow pool_window(const PoolGeometry& g, int dim, int64_t i) {
  const int64_t size = dim == 0 ? g.H : g.W;
  const int64_t out = dim == 0 ? g.OH : g.OW;
  if (g.kind == PoolKind::adaptive_avg) {
    const int64_t b = (i * size) / out, e = ((i + 1) * size + out - 1) / out;
    return {b, e, e - b};
  }
  const int64_t start = i * g.stride[dim] - g.padding[dim];
  int64_t stop = start + g.kernel[dim];
  const int64_t padded_stop = stop < size + g.padding[dim] ? stop : size + g.padding[dim];
  const int64_t b = start < 0 ? 0 : start;
  if (stop > size) stop = size;
  return {b, stop, g.count_include_pad ? padded_stop - start : stop - b};
}

// y = pooled x; for max also indices (i64, y's shape) = h * W + w of each maximum within its
// plane (torch's convention; NaN wins). x and y any strides (y dense).
DPAR_KERNEL(pool2d_forward,
            void(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& indices));
// dx (zero-filled by the kernel, dense) = the gradient of the pooling given dy; max routes
// each dy to its index, the averages spread dy / divisor over the window.
DPAR_KERNEL(pool2d_backward,
            void(const PoolGeometry& g, const Tensor& dy, const Tensor& indices, Tensor& dx));

}  // namespace dpar::kernels
