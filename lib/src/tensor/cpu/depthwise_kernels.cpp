// Depthwise-convolution weight gradient on channels-last tensors (AVX2 + FMA, and AVX-512 for
// the 5x5 and 7x7 filters' channel blocks where the CPU has it).
//
// oneDNN 2.6 has a dedicated depthwise backward-weights kernel only for 3x3 filters; 5x5 and
// 7x7 depthwise layers (most of MobileNetV3's) fall to its generic direct kernel, which takes
// several times longer than the forward pass (measured at 1 thread, batch 16: 240 channels
// 14x14 5x5 4.6 ms -> 0.8 ms; 576 channels 7x7 3.8 ms -> 0.35 ms). Here each task owns a block of
// 32, 16 or 8 channels (or one) and one or more filter rows, keeps a row's kW accumulators in
// registers and streams the input and output gradient once, reading whole cache lines because C
// is innermost. Tasks write disjoint outputs, so the result does not depend on the thread count.
// bf16 activations (amp::Autocast) are widened to f32 as they are loaded and accumulate in f32
// as f32 ones do: oneDNN 2.6's bf16 fallback for these filters took 8-45 ms per layer at batch
// 16, one thread.
//
// 3x3 filters (f32) go image by image instead: all channels of a pixel at once, the 9 taps'
// sums for every channel kept in L1. oneDNN's dedicated kernel, like the channel blocks above,
// streams the whole input once per block of channels, which on maps larger than the caches
// (MobileNetV3's 72 channels at 56x56, 29 MB at batch 32) goes to memory several times.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/cpu/float_types.h"
#include "tensor/cpu/isa.h"
#include "tensor/nn_kernels.h"

namespace dpar::cpu {
namespace {

using kernels::Conv2dGeometry;

// Eight consecutive elements as f32 lanes.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const BF16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// The most filter rows a task sweeps together (their partial sums live in L1).
constexpr int64_t kMaxRows = 7;

// For filter rows kh in [kh0, kh1): acc[kw][v] += dy[n,oh,ow,c0+8v..] * x[n, ih, ow*s - p + kw*d,
// c0+8v..] over all n, oh, ow, where ih = oh*sH - pH + kh*dH. Writes dweight[c, 0, kh, kw] for the
// block's channels. The rows are swept together, one output row at a time (their accumulators
// parked in L1 between rows), so the output row's gradient is read from memory once rather than
// once per filter row; each sum still runs over n, oh, ow in order, so its bits do not depend on
// how the rows are grouped.
template <class T, int KW, int V>
__attribute__((target("avx2,fma"))) void dw_block(const Conv2dGeometry& g, const T* x, const T* dy,
                                                  int64_t c0, int64_t kh0, int64_t kh1,
                                                  float* dweight) {
  const int64_t C = g.C, H = g.H, W = g.W, OH = g.OH, OW = g.OW;
  const int64_t sw = g.stride[1], pw = g.padding[1], dw = g.dilation[1];
  alignas(32) float parked[kMaxRows][KW][V][8] = {};
  __m256 acc[KW][V];

  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t kh = kh0; kh < kh1; ++kh) {
        const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
        if (ih < 0 || ih >= H) continue;
        for (int k = 0; k < KW; ++k)
          for (int v = 0; v < V; ++v) acc[k][v] = _mm256_load_ps(parked[kh - kh0][k][v]);
        const T* xrow = x + ((n * H + ih) * W) * C + c0;
        const T* dyrow = dy + ((n * OH + oh) * OW) * C + c0;
        for (int64_t ow = 0; ow < OW; ++ow) {
          __m256 d[V];
          for (int v = 0; v < V; ++v) d[v] = load8(dyrow + ow * C + 8 * v);
          const int64_t iw0 = ow * sw - pw;
          if (iw0 >= 0 && iw0 + (KW - 1) * dw < W) {
            for (int k = 0; k < KW; ++k) {
              const T* xp = xrow + (iw0 + k * dw) * C;
              for (int v = 0; v < V; ++v)
                acc[k][v] = _mm256_fmadd_ps(d[v], load8(xp + 8 * v), acc[k][v]);
            }
          } else {
            for (int k = 0; k < KW; ++k) {
              const int64_t iw = iw0 + k * dw;
              if (iw < 0 || iw >= W) continue;
              const T* xp = xrow + iw * C;
              for (int v = 0; v < V; ++v)
                acc[k][v] = _mm256_fmadd_ps(d[v], load8(xp + 8 * v), acc[k][v]);
            }
          }
        }
        for (int k = 0; k < KW; ++k)
          for (int v = 0; v < V; ++v) _mm256_store_ps(parked[kh - kh0][k][v], acc[k][v]);
      }
  }
  for (int64_t kh = kh0; kh < kh1; ++kh)
    for (int k = 0; k < KW; ++k)
      for (int v = 0; v < V; ++v)
        for (int l = 0; l < 8; ++l)
          dweight[((c0 + 8 * v + l) * g.kH + kh) * KW + k] = parked[kh - kh0][k][v][l];
}

#if DPAR_HAVE_ISA_CLONES
// Sixteen consecutive elements as f32 lanes. The zero-masked widening: GCC 12 reports the
// unmasked intrinsics' _mm512_undefined operand as uninitialised.
DPAR_TARGET_AVX512 __attribute__((always_inline)) inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
DPAR_TARGET_AVX512 __attribute__((always_inline)) inline __m512 load16(const BF16* p) {
  constexpr __mmask16 all = 0xffff;
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, bits), 16));
}

// dw_block on 16-lane vectors: V vectors of 16 channels per block. Each lane is one channel and
// sums the same products in the same order as dw_block's, so the bits are the same; the AVX-512
// register file holds 2*KW accumulators for 7x7 filters too. MobileNetV3-small at batch 16, one
// thread (Zen 5): conv2d_backward 29.4 -> 28.6 ms per step in f32 and 21.0 -> 19.8 ms in bf16
// (`bench_train_step --profile`), where bf16's 8-lane loads widened each element with two
// instructions more than f32's.
template <class T, int KW, int V>
DPAR_TARGET_AVX512 void dw_block16(const Conv2dGeometry& g, const T* x, const T* dy, int64_t c0,
                                   int64_t kh0, int64_t kh1, float* dweight) {
  const int64_t C = g.C, H = g.H, W = g.W, OH = g.OH, OW = g.OW;
  const int64_t sw = g.stride[1], pw = g.padding[1], dw = g.dilation[1];
  alignas(64) float parked[kMaxRows][KW][V][16] = {};
  __m512 acc[KW][V];

  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t kh = kh0; kh < kh1; ++kh) {
        const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
        if (ih < 0 || ih >= H) continue;
        for (int k = 0; k < KW; ++k)
          for (int v = 0; v < V; ++v) acc[k][v] = _mm512_load_ps(parked[kh - kh0][k][v]);
        const T* xrow = x + ((n * H + ih) * W) * C + c0;
        const T* dyrow = dy + ((n * OH + oh) * OW) * C + c0;
        for (int64_t ow = 0; ow < OW; ++ow) {
          __m512 d[V];
          for (int v = 0; v < V; ++v) d[v] = load16(dyrow + ow * C + 16 * v);
          const int64_t iw0 = ow * sw - pw;
          if (iw0 >= 0 && iw0 + (KW - 1) * dw < W) {
            for (int k = 0; k < KW; ++k) {
              const T* xp = xrow + (iw0 + k * dw) * C;
              for (int v = 0; v < V; ++v)
                acc[k][v] = _mm512_fmadd_ps(d[v], load16(xp + 16 * v), acc[k][v]);
            }
          } else {
            for (int k = 0; k < KW; ++k) {
              const int64_t iw = iw0 + k * dw;
              if (iw < 0 || iw >= W) continue;
              const T* xp = xrow + iw * C;
              for (int v = 0; v < V; ++v)
                acc[k][v] = _mm512_fmadd_ps(d[v], load16(xp + 16 * v), acc[k][v]);
            }
          }
        }
        for (int k = 0; k < KW; ++k)
          for (int v = 0; v < V; ++v) _mm512_store_ps(parked[kh - kh0][k][v], acc[k][v]);
      }
  }
  for (int64_t kh = kh0; kh < kh1; ++kh)
    for (int k = 0; k < KW; ++k)
      for (int v = 0; v < V; ++v)
        for (int l = 0; l < 16; ++l)
          dweight[((c0 + 16 * v + l) * g.kH + kh) * KW + k] = parked[kh - kh0][k][v][l];
}
#endif

// The channels past the last multiple of 8, one at a time.
template <class T>
void dw_scalar_channel(const Conv2dGeometry& g, const T* x, const T* dy, int64_t c, int64_t kh,
                       float* dweight) {
  for (int64_t kw = 0; kw < g.kW; ++kw) {
    float s = 0.0f;
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t iw = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1];
          if (iw < 0 || iw >= g.W) continue;
          s += to_float(dy[((n * g.OH + oh) * g.OW + ow) * g.C + c]) *
               to_float(x[((n * g.H + ih) * g.W + iw) * g.C + c]);
        }
      }
    dweight[(c * g.kH + kh) * g.kW + kw] = s;
  }
}

// One image's 3x3 weight-gradient sums, acc[kw + 3*kh][c] over its output pixels in order
// (f32): per output pixel and filter row, the 3 taps of all C channels (whole cache lines, as C
// is innermost), with the sums read and written in L1.
__attribute__((target("avx2,fma"))) void dw3x3_image(const Conv2dGeometry& g, const float* x,
                                                     const float* dy, float* acc) {
  const int64_t C = g.C, H = g.H, W = g.W, C8 = C / 8 * 8;
  const int64_t sw = g.stride[1], pw = g.padding[1], dw = g.dilation[1];
  std::fill(acc, acc + 9 * C, 0.0f);
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    const float* dyrow = dy + oh * g.OW * C;
    for (int64_t kh = 0; kh < 3; ++kh) {
      const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
      if (ih < 0 || ih >= H) continue;
      const float* xrow = x + ih * W * C;
      float* a = acc + kh * 3 * C;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const float* d = dyrow + ow * C;
        const int64_t iw0 = ow * sw - pw;
        if (iw0 >= 0 && iw0 + 2 * dw < W) {  // all three taps inside the row
          const float* x0 = xrow + iw0 * C;
          const float* x1 = x0 + dw * C;
          const float* x2 = x1 + dw * C;
          int64_t c = 0;
          for (; c < C8; c += 8) {
            const __m256 dv = _mm256_loadu_ps(d + c);
            _mm256_storeu_ps(a + c,
                             _mm256_fmadd_ps(dv, _mm256_loadu_ps(x0 + c), _mm256_loadu_ps(a + c)));
            _mm256_storeu_ps(a + C + c, _mm256_fmadd_ps(dv, _mm256_loadu_ps(x1 + c),
                                                        _mm256_loadu_ps(a + C + c)));
            _mm256_storeu_ps(a + 2 * C + c, _mm256_fmadd_ps(dv, _mm256_loadu_ps(x2 + c),
                                                            _mm256_loadu_ps(a + 2 * C + c)));
          }
          for (; c < C; ++c) {
            a[c] += d[c] * x0[c];
            a[C + c] += d[c] * x1[c];
            a[2 * C + c] += d[c] * x2[c];
          }
          continue;
        }
        // At the row's ends: the taps the padding leaves.
        const int64_t kw0 = iw0 >= 0 ? 0 : (-iw0 + dw - 1) / dw;
        const int64_t kw1 = std::min<int64_t>(3, iw0 < W ? (W - 1 - iw0) / dw + 1 : 0);
        for (int64_t kw = kw0; kw < kw1; ++kw) {
          const float* xp = xrow + (iw0 + kw * dw) * C;
          float* ak = a + kw * C;
          int64_t c = 0;
          for (; c < C8; c += 8) {
            _mm256_storeu_ps(ak + c,
                             _mm256_fmadd_ps(_mm256_loadu_ps(d + c), _mm256_loadu_ps(xp + c),
                                             _mm256_loadu_ps(ak + c)));
          }
          for (; c < C; ++c) ak[c] += d[c] * xp[c];
        }
      }
    }
  }
}

// 3x3, f32: images in parallel, each summed apart (dw3x3_image), the images' sums then added in
// image order in double, so the bits do not depend on the thread count.
void depthwise3x3_backward_weights(const Conv2dGeometry& g, const float* x, const float* dy,
                                   float* dweight) {
  const int64_t C = g.C, per_image = 9 * C;
  std::vector<float> sums(static_cast<size_t>(g.N * per_image));
  const int64_t work = g.N * g.OH * g.OW * C * 9;
#pragma omp parallel for schedule(static) if (g.N > 1 && work > (1 << 18))
  for (int64_t n = 0; n < g.N; ++n) {
    dw3x3_image(g, x + n * g.H * g.W * C, dy + n * g.OH * g.OW * C, sums.data() + n * per_image);
  }
  std::vector<double> total(static_cast<size_t>(per_image), 0.0);
  for (int64_t n = 0; n < g.N; ++n) {
    const float* s = sums.data() + n * per_image;
    for (int64_t i = 0; i < per_image; ++i) total[static_cast<size_t>(i)] += s[i];
  }
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < 9; ++k)
      dweight[c * 9 + k] = static_cast<float>(total[static_cast<size_t>(k * C + c)]);
}

// The bias gradient: the output gradient's channel sums, rows in order.
template <class T>
void depthwise_bias_gradient(const Conv2dGeometry& g, const T* dy, float* dbias) {
  for (int64_t c = 0; c < g.C; ++c) dbias[c] = 0.0f;
  const int64_t rows = g.N * g.OH * g.OW;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = dy + r * g.C;
    for (int64_t c = 0; c < g.C; ++c) dbias[c] += to_float(row[c]);
  }
}

template <class T>
using BlockFn = void (*)(const Conv2dGeometry&, const T*, const T*, int64_t, int64_t, int64_t,
                         float*);

// A block of `width` channels from c0 for `fn`, or (fn null) one channel for dw_scalar_channel.
template <class T>
struct ChannelBlock {
  BlockFn<T> fn;
  int64_t c0, width;
};

// The channels in blocks, widest first: 32 and 16 on 16-lane vectors where the CPU has
// AVX-512, two 8-lane vectors while 2*KW accumulators fit the 16 ymm registers, one, then the
// channels past the last multiple of 8 one at a time.
template <class T, int KW>
std::vector<ChannelBlock<T>> channel_blocks(int64_t C) {
  std::vector<std::pair<BlockFn<T>, int64_t>> kernels;
#if DPAR_HAVE_ISA_CLONES
  if (cpu_isa() == Isa::avx512) {
    kernels.push_back({&dw_block16<T, KW, 2>, 32});
    kernels.push_back({&dw_block16<T, KW, 1>, 16});
  }
#endif
  if constexpr (KW <= 5) kernels.push_back({&dw_block<T, KW, 2>, 16});
  kernels.push_back({&dw_block<T, KW, 1>, 8});
  std::vector<ChannelBlock<T>> blocks;
  int64_t c = 0;
  for (const auto& [fn, width] : kernels) {
    for (; C - c >= width; c += width) blocks.push_back({fn, c, width});
  }
  for (; c < C; ++c) blocks.push_back({nullptr, c, 1});
  return blocks;
}

template <class T>
bool depthwise_backward_weights_typed(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                                      Tensor& dweight, Tensor& dbias) {
  std::vector<ChannelBlock<T>> blocks;
  switch (g.kW) {
    case 3:
      // bf16 3x3 stays with oneDNN's dedicated kernel (not measured against this one).
      if (g.kH != 3 || !std::is_same_v<T, float>) return false;
      depthwise3x3_backward_weights(g, data_as<const float>(x), data_as<const float>(dy),
                                    dweight.data<float>());
      if (g.has_bias) depthwise_bias_gradient(g, data_as<const T>(dy), dbias.data<float>());
      return true;
    case 5:
      blocks = channel_blocks<T, 5>(g.C);
      break;
    case 7:
      blocks = channel_blocks<T, 7>(g.C);
      break;
    default:
      return false;
  }
  if (blocks.empty()) return false;  // no channels: nothing for these kernels
  const T* px = data_as<const T>(x);
  const T* pdy = data_as<const T>(dy);
  float* pdw = dweight.data<float>();
  // Tasks: each block for a group of filter rows. Where the widest block's input and output
  // gradient fit in L2, one filter row per task: the block's next row finds them there. Larger
  // ones sweep all the filter rows together where there are blocks enough to keep every thread
  // busy (four tasks per thread). Batch 16, one thread, best of five alternations with the
  // previous library (8-lane blocks, AVX2): 240 channels at 14x14 1.30 -> 0.93 ms, 96 at 28x28
  // stride 2 0.55 -> 0.41; 576 at 7x7, which fits, 0.645 by rows against 0.671 swept.
  constexpr int64_t kL2Bytes = 256 << 10;
  const auto n_blocks = static_cast<int64_t>(blocks.size());
  const int64_t threads = omp_get_max_threads();
  const int64_t block_bytes =
      g.N * (g.OH * g.OW + g.H * g.W) * blocks.front().width * static_cast<int64_t>(sizeof(T));
  const int64_t splits =
      block_bytes <= kL2Bytes
          ? g.kH
          : std::clamp<int64_t>((4 * threads + n_blocks - 1) / n_blocks, 1, g.kH);
  const int64_t rows_per_task = std::min((g.kH + splits - 1) / splits, kMaxRows);
  const int64_t groups = (g.kH + rows_per_task - 1) / rows_per_task;
  const int64_t tasks = n_blocks * groups;
  // Threads only pay off once each has a few hundred thousand multiply-adds.
  const int64_t work = g.N * g.OH * g.OW * g.C * g.kH * g.kW;
#pragma omp parallel for schedule(static) if (work > (1 << 18))
  for (int64_t t = 0; t < tasks; ++t) {
    const ChannelBlock<T>& block = blocks[static_cast<size_t>(t / groups)];
    const int64_t kh0 = t % groups * rows_per_task;
    const int64_t kh1 = std::min(kh0 + rows_per_task, g.kH);
    if (block.fn != nullptr) {
      block.fn(g, px, pdy, block.c0, kh0, kh1, pdw);
    } else {
      for (int64_t kh = kh0; kh < kh1; ++kh) dw_scalar_channel(g, px, pdy, block.c0, kh, pdw);
    }
  }
  if (g.has_bias) depthwise_bias_gradient(g, pdy, dbias.data<float>());
  return true;
}

}  // namespace

// x and dy f32 or bf16 (the same); dweight and dbias f32.
bool depthwise_backward_weights(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                                Tensor& dweight, Tensor& dbias) {
  static const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!has_avx2 || g.groups != g.C || g.O != g.C || dweight.dtype() != DType::f32) return false;
  if (x.dtype() == DType::f32)
    return depthwise_backward_weights_typed<float>(g, x, dy, dweight, dbias);
  if (x.dtype() == DType::bf16)
    return depthwise_backward_weights_typed<BF16>(g, x, dy, dweight, dbias);
  return false;
}

}  // namespace dpar::cpu
