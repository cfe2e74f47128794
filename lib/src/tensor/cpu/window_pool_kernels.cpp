// CPU max / average / adaptive-average pooling over [N,C,H,W] of any strides: the planes
// (n, c) in parallel, each window in the order torch scans it (rows, then columns).
#include <cmath>
#include <limits>

#include "tensor/window_pool.h"

namespace dpar::cpu {
namespace {

using kernels::pool_window;
using kernels::PoolGeometry;
using kernels::PoolKind;

void pool2d_forward_cpu(const PoolGeometry& g, const Tensor& x, Tensor& y, Tensor& indices) {
  const float* px = static_cast<const float*>(x.raw_data());
  float* py = static_cast<float*>(y.raw_data());
  int64_t* pi = g.kind == PoolKind::max ? static_cast<int64_t*>(indices.raw_data()) : nullptr;
  const int64_t xs[4] = {x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
  const int64_t ys[4] = {y.stride(0), y.stride(1), y.stride(2), y.stride(3)};
  const int64_t planes = g.N * g.C;
#pragma omp parallel for schedule(static) if (planes * g.OH * g.OW > 16384)
  for (int64_t p = 0; p < planes; ++p) {
    const int64_t n = p / g.C, c = p % g.C;
    const float* xp = px + n * xs[0] + c * xs[1];
    const int64_t yoff = n * ys[0] + c * ys[1];
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const auto wh = pool_window(g, 0, oh);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const auto ww = pool_window(g, 1, ow);
        const int64_t at = yoff + oh * ys[2] + ow * ys[3];
        if (g.kind == PoolKind::max) {
          float best = -std::numeric_limits<float>::infinity();
          int64_t best_index = wh.begin * g.W + ww.begin;
          for (int64_t h = wh.begin; h < wh.end; ++h) {
            for (int64_t w = ww.begin; w < ww.end; ++w) {
              const float v = xp[h * xs[2] + w * xs[3]];
              if (v > best || std::isnan(v)) {
                best = v;
                best_index = h * g.W + w;
                if (std::isnan(v)) goto done;  // NaN is the maximum: stop at the first
              }
            }
          }
        done:
          py[at] = best;
          pi[at] = best_index;
        } else {
          float s = 0.f;
          for (int64_t h = wh.begin; h < wh.end; ++h) {
            for (int64_t w = ww.begin; w < ww.end; ++w) s += xp[h * xs[2] + w * xs[3]];
          }
          py[at] = s / static_cast<float>(wh.divisor * ww.divisor);
        }
      }
    }
  }
}

void pool2d_backward_cpu(const PoolGeometry& g, const Tensor& dy, const Tensor& indices,
                         Tensor& dx) {
  const float* pdy = static_cast<const float*>(dy.raw_data());
  float* pdx = static_cast<float*>(dx.raw_data());
  const int64_t* pi =
      g.kind == PoolKind::max ? static_cast<const int64_t*>(indices.raw_data()) : nullptr;
  const int64_t ds[4] = {dy.stride(0), dy.stride(1), dy.stride(2), dy.stride(3)};
  const int64_t xs[4] = {dx.stride(0), dx.stride(1), dx.stride(2), dx.stride(3)};
  const int64_t is[4] = {pi ? indices.stride(0) : 0, pi ? indices.stride(1) : 0,
                         pi ? indices.stride(2) : 0, pi ? indices.stride(3) : 0};
  const int64_t planes = g.N * g.C;
  // One plane per thread, its windows in order: overlapping windows add up deterministically.
#pragma omp parallel for schedule(static) if (planes * g.OH * g.OW > 16384)
  for (int64_t p = 0; p < planes; ++p) {
    const int64_t n = p / g.C, c = p % g.C;
    float* xp = pdx + n * xs[0] + c * xs[1];
    for (int64_t h = 0; h < g.H; ++h) {
      for (int64_t w = 0; w < g.W; ++w) xp[h * xs[2] + w * xs[3]] = 0.f;
    }
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const auto wh = pool_window(g, 0, oh);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const float grad = pdy[n * ds[0] + c * ds[1] + oh * ds[2] + ow * ds[3]];
        if (g.kind == PoolKind::max) {
          const int64_t k = pi[n * is[0] + c * is[1] + oh * is[2] + ow * is[3]];
          xp[(k / g.W) * xs[2] + (k % g.W) * xs[3]] += grad;
          continue;
        }
        const auto ww = pool_window(g, 1, ow);
        const float share = grad / static_cast<float>(wh.divisor * ww.divisor);
        for (int64_t h = wh.begin; h < wh.end; ++h) {
          for (int64_t w = ww.begin; w < ww.end; ++w) xp[h * xs[2] + w * xs[3]] += share;
        }
      }
    }
  }
}

}  // namespace

void register_window_pool_kernels() {
  kernels::pool2d_forward.set(DeviceType::CPU, &pool2d_forward_cpu);
  kernels::pool2d_backward.set(DeviceType::CPU, &pool2d_backward_cpu);
}

}  // namespace dpar::cpu
