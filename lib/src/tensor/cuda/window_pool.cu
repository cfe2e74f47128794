// CUDA max / average / adaptive-average pooling over [N,C,H,W] of any strides: one thread per
// output element forward; backward one thread per input element, summing the windows that
// cover it in torch's order (no atomics: the same bits every run).
#include <cstdint>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/window_pool.h"

namespace dpar::cuda {
namespace {

using kernels::pool_window;
using kernels::PoolGeometry;
using kernels::PoolKind;

struct Strides4 {
  int64_t s[4];
};

Strides4 strides_of(const Tensor& t) {
  if (!t.defined()) return {{0, 0, 0, 0}};
  return {{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
}

__global__ void pool_forward_kernel(PoolGeometry g, const float* x, Strides4 xs, float* y,
                                    Strides4 ys, int64_t* idx, Strides4 is, int64_t total) {
  DPAR_CUDA_KERNEL_LOOP(i, total) {
    const int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, c = (i / (g.OW * g.OH)) % g.C,
                  n = i / (g.OW * g.OH * g.C);
    const float* xp = x + n * xs.s[0] + c * xs.s[1];
    const auto wh = pool_window(g, 0, oh), ww = pool_window(g, 1, ow);
    const int64_t at = n * ys.s[0] + c * ys.s[1] + oh * ys.s[2] + ow * ys.s[3];
    if (g.kind == PoolKind::max) {
      float best = -INFINITY;
      int64_t best_index = wh.begin * g.W + ww.begin;
      bool stop = false;
      for (int64_t h = wh.begin; h < wh.end && !stop; ++h) {
        for (int64_t w = ww.begin; w < ww.end; ++w) {
          const float v = xp[h * xs.s[2] + w * xs.s[3]];
          if (v > best || isnan(v)) {
            best = v;
            best_index = h * g.W + w;
            if (isnan(v)) {
              stop = true;
              break;
            }
          }
        }
      }
      y[at] = best;
      idx[n * is.s[0] + c * is.s[1] + oh * is.s[2] + ow * is.s[3]] = best_index;
    } else {
      float s = 0.f;
      for (int64_t h = wh.begin; h < wh.end; ++h) {
        for (int64_t w = ww.begin; w < ww.end; ++w) s += xp[h * xs.s[2] + w * xs.s[3]];
      }
      y[at] = s / static_cast<float>(wh.divisor * ww.divisor);
    }
  }
}

// The output positions along one dim whose windows may contain input position p: a range
// that is checked window by window (adaptive and regular windows alike).
__device__ void candidate_outputs(const PoolGeometry& g, int dim, int64_t p, int64_t* lo,
                                  int64_t* hi) {
  const int64_t out = dim == 0 ? g.OH : g.OW;
  if (g.kind == PoolKind::adaptive_avg) {
    const int64_t size = dim == 0 ? g.H : g.W;
    *lo = (p * out) / size;
    *hi = ((p + 1) * out + size - 1) / size;
  } else {
    const int64_t k = g.kernel[dim], s = g.stride[dim], pad = g.padding[dim];
    const int64_t first = p + pad - k + 1;
    *lo = first <= 0 ? 0 : (first + s - 1) / s;
    *hi = (p + pad) / s + 1;
  }
  if (*hi > out) *hi = out;
}

__global__ void pool_backward_kernel(PoolGeometry g, const float* dy, Strides4 ds,
                                     const int64_t* idx, Strides4 is, float* dx, Strides4 xs,
                                     int64_t total) {
  DPAR_CUDA_KERNEL_LOOP(i, total) {
    const int64_t w = i % g.W, h = (i / g.W) % g.H, c = (i / (g.W * g.H)) % g.C,
                  n = i / (g.W * g.H * g.C);
    int64_t oh0, oh1, ow0, ow1;
    candidate_outputs(g, 0, h, &oh0, &oh1);
    candidate_outputs(g, 1, w, &ow0, &ow1);
    float acc = 0.f;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const auto wh = pool_window(g, 0, oh);
      if (h < wh.begin || h >= wh.end) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const auto ww = pool_window(g, 1, ow);
        if (w < ww.begin || w >= ww.end) continue;
        const float grad = dy[n * ds.s[0] + c * ds.s[1] + oh * ds.s[2] + ow * ds.s[3]];
        if (g.kind == PoolKind::max) {
          if (idx[n * is.s[0] + c * is.s[1] + oh * is.s[2] + ow * is.s[3]] == h * g.W + w) {
            acc += grad;
          }
        } else {
          acc += grad / static_cast<float>(wh.divisor * ww.divisor);
        }
      }
    }
    dx[n * xs.s[0] + c * xs.s[1] + h * xs.s[2] + w * xs.s[3]] = acc;
  }
}

void pool2d_forward_cuda(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& indices) {
  DeviceGuard guard(y.device());
  const int64_t total = y.numel();
  if (total == 0) return;
  pool_forward_kernel<<<blocks_for(total), kThreads, 0, current_stream()>>>(
      g, static_cast<const float*>(x.raw_data()), strides_of(x), static_cast<float*>(y.raw_data()),
      strides_of(y), indices.defined() ? static_cast<int64_t*>(indices.raw_data()) : nullptr,
      strides_of(indices), total);
  check_launch("pool2d_forward");
}

void pool2d_backward_cuda(const PoolGeometry& g, const Tensor& dy, const Tensor& indices,
                          Tensor& dx) {
  DeviceGuard guard(dx.device());
  const int64_t total = dx.numel();
  if (total == 0) return;
  pool_backward_kernel<<<blocks_for(total), kThreads, 0, current_stream()>>>(
      g, static_cast<const float*>(dy.raw_data()), strides_of(dy),
      indices.defined() ? static_cast<const int64_t*>(indices.raw_data()) : nullptr,
      strides_of(indices), static_cast<float*>(dx.raw_data()), strides_of(dx), total);
  check_launch("pool2d_backward");
}

}  // namespace

void register_window_pool_kernels() {
  kernels::pool2d_forward.set(DeviceType::CUDA, &pool2d_forward_cuda);
  kernels::pool2d_backward.set(DeviceType::CUDA, &pool2d_backward_cuda);
}

}  // namespace dpar::cuda
