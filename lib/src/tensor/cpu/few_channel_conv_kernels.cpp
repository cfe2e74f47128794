// The weight gradient of convolutions with few input channels (a network's stem: RGB in, 8-32
// channels out) on channels-last f32 tensors (AVX2 + FMA).
//
// oneDNN 2.6 runs MobileNetV3's stem (3 -> 16 channels, 3x3, stride 2) with its generic direct
// kernel, built for many input channels; its weight gradient ran at 45-50 GFLOP/s (batch 16,
// one thread, AVX2: 3.6-3.9 ms) and 60 at two threads (2.9 ms). The C x kW inputs under one
// filter row are contiguous in a channels-last row, so a group of those taps keeps its
// accumulators for all O output channels in registers (the output channels are the vector
// lanes, the inputs are broadcast) while one sweep goes along an output row: 2.8-3.6 ms at one
// thread, 1.7-2.0 at two. Each row is summed in f32 and the rows in double, per block of rows
// and then the blocks in sequence, so the result does not depend on the thread count. (A
// forward built the same way was no faster than oneDNN's, which stays.)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/cpu/isa.h"
#include "tensor/nn_kernels.h"

namespace dpar::cpu {
namespace {

using kernels::Conv2dGeometry;

#define DPAR_AVX2_FN __attribute__((target("avx2,fma")))
#define DPAR_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline))

// Calls f(integral_constant<int, i>) for i = 0 .. N-1 in straight-line code. The accumulator
// arrays are then indexed by constants only, which lets GCC keep them in registers: with plain
// loops over taps and lanes, GCC 12 kept a copy of every accumulator on the stack, one store
// per multiply-add, and the kernel ran at half speed.
template <int N, class F>
DPAR_AVX2_INLINE inline void unroll(F&& f) {
  [&]<int... i>(std::integer_sequence<int, i...>) DPAR_AVX2_INLINE {
    (f(std::integral_constant<int, i>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}

// Output rows per block of the weight gradient's partial sums.
constexpr int64_t kRowsPerBlock = 8;

// The filter taps of one filter row, in a channels-last input row's order: t = kw * C + c.
struct Layout {
  int64_t taps_per_row = 0;  // kW * C
  int64_t ow_first = 0;      // the output columns whose window lies inside the input row:
  int64_t ow_last = -1;      // [ow_first, ow_last]
};

Layout layout_of(const Conv2dGeometry& g) {
  Layout l;
  l.taps_per_row = g.kW * g.C;
  const int64_t s = g.stride[1], p = g.padding[1];
  l.ow_first = std::min<int64_t>((p + s - 1) / s, g.OW);
  const int64_t span = g.W - g.kW + p;  // ow * s <= span keeps the window's right end inside
  l.ow_last = span < 0 ? -1 : std::min<int64_t>(span / s, g.OW - 1);
  return l;
}

// Whether the input row ih lies inside the image.
inline bool row_inside(const Conv2dGeometry& g, int64_t ih) { return ih >= 0 && ih < g.H; }

// Adds one pixel's products for taps [t0, t0 + G) whose inputs may lie in the padding.
template <int V, int G>
DPAR_AVX2_INLINE inline void weight_edge_pixel(const Conv2dGeometry& g, const float* x_row,
                                               const float* dy_row, int64_t ow, int64_t t0,
                                               __m256 (&acc)[G][V]) {
  const int64_t C = g.C;
  __m256 d[V];
  unroll<V>([&](auto v) DPAR_AVX2_INLINE { d[v] = _mm256_loadu_ps(dy_row + ow * g.O + 8 * v); });
  unroll<G>([&](auto k) DPAR_AVX2_INLINE {
    const int64_t t = t0 + k, iw = ow * g.stride[1] - g.padding[1] + t / C;
    if (iw < 0 || iw >= g.W) return;
    const __m256 b = _mm256_broadcast_ss(x_row + iw * C + t % C);
    unroll<V>([&](auto v) DPAR_AVX2_INLINE { acc[k][v] = _mm256_fmadd_ps(b, d[v], acc[k][v]); });
  });
}

// For taps [t0, t0 + G) of filter row kh: sum over the output row's pixels of
// dy[ow, :] * x[ih, ow * sw - pw, t], added (in double) into part[kh][t][O].
template <int V, int G>
DPAR_AVX2_FN void weight_taps(const Conv2dGeometry& g, const Layout& l, const float* x_row,
                              const float* dy_row, int64_t kh, int64_t t0, double* part) {
  const int64_t C = g.C, O = g.O, sw = g.stride[1], pw = g.padding[1];
  __m256 acc[G][V];
  unroll<G>([&](auto k) DPAR_AVX2_INLINE {
    unroll<V>([&](auto v) DPAR_AVX2_INLINE { acc[k][v] = _mm256_setzero_ps(); });
  });
  int64_t ow = 0;
  for (; ow < l.ow_first; ++ow) weight_edge_pixel<V, G>(g, x_row, dy_row, ow, t0, acc);
  for (; ow <= l.ow_last; ++ow) {
    const float* xp = x_row + (ow * sw - pw) * C + t0;
    __m256 d[V];
    unroll<V>([&](auto v) DPAR_AVX2_INLINE { d[v] = _mm256_loadu_ps(dy_row + ow * O + 8 * v); });
    unroll<G>([&](auto k) DPAR_AVX2_INLINE {
      const __m256 b = _mm256_broadcast_ss(xp + k);
      unroll<V>([&](auto v) DPAR_AVX2_INLINE { acc[k][v] = _mm256_fmadd_ps(b, d[v], acc[k][v]); });
    });
  }
  for (; ow < g.OW; ++ow) weight_edge_pixel<V, G>(g, x_row, dy_row, ow, t0, acc);
  unroll<G>([&](auto k) DPAR_AVX2_INLINE {
    double* out = part + (kh * l.taps_per_row + t0 + k) * O;
    unroll<V>([&](auto v) DPAR_AVX2_INLINE {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[k][v]);
      for (int j = 0; j < 8; ++j) out[8 * v + j] += static_cast<double>(lanes[j]);
    });
  });
}

// Taps per group: G * V accumulators, V gradient vectors and a broadcast in 16 registers.
template <int V>
constexpr int kTapGroup = V == 1   ? 12
                          : V == 2 ? 6
                                   : 3;

template <int V>
using TapsFn = void (*)(const Conv2dGeometry&, const Layout&, const float*, const float*, int64_t,
                        int64_t, double*);

template <int V, int... G>
TapsFn<V> taps_fn(int group, std::integer_sequence<int, G...>) {
  TapsFn<V> fn = nullptr;
  ((group == G + 1 ? (fn = &weight_taps<V, G + 1>, 0) : 0), ...);
  return fn;
}

// One block of output rows into part ([kH][taps][O], zeroed by the caller).
template <int V>
void weight_rows(const Conv2dGeometry& g, const Layout& l, const float* x, const float* dy,
                 int64_t first_row, int64_t last_row, double* part) {
  constexpr int G = kTapGroup<V>;
  const auto sizes = std::make_integer_sequence<int, G>();
  const TapsFn<V> full = taps_fn<V>(G, sizes);
  const TapsFn<V> rest = taps_fn<V>(static_cast<int>(l.taps_per_row % G), sizes);
  for (int64_t r = first_row; r < last_row; ++r) {
    const int64_t n = r / g.OH, oh = r % g.OH;
    const float* dy_row = dy + r * g.OW * g.O;
    for (int64_t kh = 0; kh < g.kH; ++kh) {
      const int64_t ih = oh * g.stride[0] - g.padding[0] + kh;
      if (!row_inside(g, ih)) continue;
      const float* x_row = x + ((n * g.H + ih) * g.W) * g.C;
      int64_t t0 = 0;
      for (; t0 + G <= l.taps_per_row; t0 += G) full(g, l, x_row, dy_row, kh, t0, part);
      if (rest) rest(g, l, x_row, dy_row, kh, t0, part);
    }
  }
}

template <int V>
void weight_gradient(const Conv2dGeometry& g, const float* x, const float* dy, float* dweight) {
  const Layout l = layout_of(g);
  const int64_t per_block = g.kH * l.taps_per_row * g.O;
  // Blocks never straddle two images, so the blocking depends on the shape alone.
  const int64_t blocks_per_image = (g.OH + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t blocks = g.N * blocks_per_image;
  std::vector<double> parts(static_cast<size_t>(blocks * per_block), 0.0);
#pragma omp parallel for schedule(static) if (g.N * g.OH * g.OW * per_block > (1 << 18))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n = b / blocks_per_image, first = (b % blocks_per_image) * kRowsPerBlock;
    const int64_t last = std::min(first + kRowsPerBlock, g.OH);
    weight_rows<V>(g, l, x, dy, n * g.OH + first, n * g.OH + last, parts.data() + b * per_block);
  }
  // dweight[o][c][kh][kw] from the blocks' sums over [kh][kw * C + c][o], in block order.
  for (int64_t kh = 0; kh < g.kH; ++kh)
    for (int64_t t = 0; t < l.taps_per_row; ++t) {
      const int64_t kw = t / g.C, c = t % g.C;
      for (int64_t o = 0; o < g.O; ++o) {
        double s = 0.0;
        const size_t at = static_cast<size_t>((kh * l.taps_per_row + t) * g.O + o);
        for (int64_t b = 0; b < blocks; ++b) s += parts[at + static_cast<size_t>(b * per_block)];
        dweight[((o * g.C + c) * g.kH + kh) * g.kW + kw] = static_cast<float>(s);
      }
    }
}

// The shapes this kernel takes: an ungrouped f32 convolution with at most 4 input channels and
// 8, 16 or 32 output channels, no dilation, on channels-last tensors, on a CPU with AVX2.
bool takes(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy) {
  constexpr int64_t kMaxInputChannels = 4;
  const bool shape = g.groups == 1 && g.C <= kMaxInputChannels &&
                     (g.O == 8 || g.O == 16 || g.O == 32) && g.dilation[0] == 1 &&
                     g.dilation[1] == 1 && g.N * g.OH * g.OW > 0;
  return shape && cpu_isa() != Isa::baseline && x.dtype() == DType::f32 &&
         dy.dtype() == DType::f32 && x.is_contiguous(MemoryFormat::ChannelsLast) &&
         dy.is_contiguous(MemoryFormat::ChannelsLast);
}

}  // namespace

bool few_channel_conv_backward_weights(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                                       Tensor& dweight) {
  if (g.has_bias || !takes(g, x, dy) || dweight.dtype() != DType::f32 || !dweight.is_contiguous()) {
    return false;
  }
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdw = dweight.data<float>();
  switch (g.O) {
    case 8:
      weight_gradient<1>(g, px, pdy, pdw);
      break;
    case 16:
      weight_gradient<2>(g, px, pdy, pdw);
      break;
    default:
      weight_gradient<4>(g, px, pdy, pdw);
      break;
  }
  return true;
}

}  // namespace dpar::cpu
