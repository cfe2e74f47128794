// The forward and input gradient of a 3x3 depthwise convolution with stride 2 and padding 1 on
// channels-last f32 tensors (AVX2 + FMA): MobileNet's downsampling depthwise layers.
//
// oneDNN 2.6's depthwise kernels walk one block of 8 channels at a time along a row, so a row of
// many channels is read from a different place for each block. With stride 2 the input is 4x the
// output, and on large maps (MobileNetV3-small's 72 channels at 56x56, 29 MB at batch 32) that
// walk ran at about a third of the memory's speed. Here every output pixel (or input pixel, for
// the gradient) takes all its channels at once: each tap reads whole cache lines, in the order
// they lie in memory. Each output element is one thread's, summed in a fixed tap order, so the
// bits do not depend on the thread count.
#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "tensor/nn_kernels.h"

namespace dpar::cpu {
namespace {

using kernels::Conv2dGeometry;

// The filter as taps[k][c] (k = 3 * kh + kw): a tap's weights for all channels in a row.
std::vector<float> taps_by_channel(const float* weight, int64_t C) {
  std::vector<float> taps(static_cast<size_t>(9 * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < 9; ++k) taps[static_cast<size_t>(k * C + c)] = weight[c * 9 + k];
  return taps;
}

// out[c] = start[c] + sum over the n terms of src[t][c] * tap[t][c], the terms in order.
__attribute__((target("avx2,fma"), always_inline)) inline void channel_dot(const float* const* src,
                                                                           const float* const* tap,
                                                                           int n,
                                                                           const float* start,
                                                                           int64_t C, float* out) {
  const int64_t C8 = C / 8 * 8;
  int64_t c = 0;
  for (; c < C8; c += 8) {
    __m256 acc = start ? _mm256_loadu_ps(start + c) : _mm256_setzero_ps();
    for (int t = 0; t < n; ++t)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(src[t] + c), _mm256_loadu_ps(tap[t] + c), acc);
    _mm256_storeu_ps(out + c, acc);
  }
  for (; c < C; ++c) {
    float acc = start ? start[c] : 0.0f;
    for (int t = 0; t < n; ++t) acc = __builtin_fmaf(src[t][c], tap[t][c], acc);
    out[c] = acc;
  }
}

// Output row `row` (n * OH + oh) of the forward: each pixel's taps inside the input, in order.
__attribute__((target("avx2,fma"))) void forward_row(const Conv2dGeometry& g, const float* x,
                                                     const float* taps, const float* bias,
                                                     int64_t row, float* y) {
  const int64_t C = g.C, H = g.H, W = g.W, n = row / g.OH, oh = row % g.OH;
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    const float* src[9];
    const float* tap[9];
    int terms = 0;
    for (int64_t kh = 0; kh < 3; ++kh) {
      const int64_t ih = 2 * oh - 1 + kh;
      if (ih < 0 || ih >= H) continue;
      for (int64_t kw = 0; kw < 3; ++kw) {
        const int64_t iw = 2 * ow - 1 + kw;
        if (iw < 0 || iw >= W) continue;
        src[terms] = x + ((n * H + ih) * W + iw) * C;
        tap[terms++] = taps + (3 * kh + kw) * C;
      }
    }
    channel_dot(src, tap, terms, bias, C, y + (row * g.OW + ow) * C);
  }
}

// Input row `row` (n * H + ih) of the input gradient: dx[ih, iw] = sum of dy[oh, ow] * w[kh, kw]
// over the taps with ih = 2 oh - 1 + kh and iw = 2 ow - 1 + kw, one, two or four of them,
// gathered (dx written once).
__attribute__((target("avx2,fma"))) void input_gradient_row(const Conv2dGeometry& g,
                                                            const float* dy, const float* taps,
                                                            int64_t row, float* dx) {
  const int64_t C = g.C, W = g.W, OH = g.OH, OW = g.OW, n = row / g.H, ih = row % g.H;
  for (int64_t iw = 0; iw < W; ++iw) {
    const float* src[4];
    const float* tap[4];
    int terms = 0;
    // kh of the parity of ih + 1 (kh = 0 and 2, or 1), within the output's rows.
    for (int64_t kh = (ih + 1) % 2; kh < 3; kh += 2) {
      const int64_t oh = (ih + 1 - kh) / 2;
      if (oh < 0 || oh >= OH) continue;
      for (int64_t kw = (iw + 1) % 2; kw < 3; kw += 2) {
        const int64_t ow = (iw + 1 - kw) / 2;
        if (ow < 0 || ow >= OW) continue;
        src[terms] = dy + ((n * OH + oh) * OW + ow) * C;
        tap[terms++] = taps + (3 * kh + kw) * C;
      }
    }
    channel_dot(src, tap, terms, nullptr, C, dx + (row * W + iw) * C);
  }
}

// Fewer than 32 channels stay with oneDNN: a pixel's channels are one or two cache lines, which
// its walk reads no worse, and it is faster where the maps stay in cache (16 channels at
// 112x112, batch 16, one thread: forward 1.1-1.3 ms against these loops' 2.2, input gradient
// 1.8-2.2 against 2.8-3.2).
bool applies(const Conv2dGeometry& g, const Tensor& a, const Tensor& b, const Tensor& weight) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 && g.C >= 32 && g.groups == g.C && g.O == g.C && g.kH == 3 && g.kW == 3 &&
         g.stride[0] == 2 && g.stride[1] == 2 && g.padding[0] == 1 && g.padding[1] == 1 &&
         g.dilation[0] == 1 && g.dilation[1] == 1 && a.dtype() == DType::f32 &&
         b.dtype() == DType::f32 && weight.dtype() == DType::f32 && weight.is_contiguous() &&
         a.is_contiguous(MemoryFormat::ChannelsLast) && b.is_contiguous(MemoryFormat::ChannelsLast);
}

}  // namespace

bool depthwise3x3_stride2_forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight,
                                  const Tensor& bias, Tensor& y) {
  if (!applies(g, x, y, weight)) return false;
  const std::vector<float> taps = taps_by_channel(weight.data<float>(), g.C);
  const float* px = x.data<float>();
  const float* pb = g.has_bias ? bias.data<float>() : nullptr;
  float* py = y.data<float>();
#pragma omp parallel for schedule(static) if (g.N * g.OH * g.OW * g.C > (1 << 16))
  for (int64_t row = 0; row < g.N * g.OH; ++row) forward_row(g, px, taps.data(), pb, row, py);
  return true;
}

bool depthwise3x3_stride2_backward_data(const Conv2dGeometry& g, const Tensor& dy,
                                        const Tensor& weight, Tensor& dx) {
  if (!applies(g, dy, dx, weight)) return false;
  const std::vector<float> taps = taps_by_channel(weight.data<float>(), g.C);
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
#pragma omp parallel for schedule(static) if (g.N * g.H * g.W * g.C > (1 << 16))
  for (int64_t row = 0; row < g.N * g.H; ++row) input_gradient_row(g, pdy, taps.data(), row, pdx);
  return true;
}

}  // namespace dpar::cpu
