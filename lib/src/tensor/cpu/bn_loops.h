#pragma once
// The batch-norm loops dpar runs itself on the CPU, templated on the activations' storage type
// (float, or BF16 for amp::Autocast's activations; statistics and parameters in f32):
//   - the backward from the forward output (kernel slot batch_norm_backward_from_output), for
//     f32 and bf16;
//   - the forward (batch statistics or running ones), for bf16, where oneDNN 2.6 has a jit
//     kernel only for channel counts that are multiples of 16 (the others, MobileNetV3's 24,
//     40, 72, 88 and 120, fell to its generic nspc kernel: 4-10 ms per layer at batch 16 on one
//     thread).
// Everything is in an unnamed namespace: each file that includes this gets its own copies,
// compiled for the ISA in force where it is included. norm_kernels.cpp includes it for the x86-64
// baseline and avx512_bf16_kernels.cpp for AVX-512 (the bf16 path of a CPU that has it), and
// the two must never be merged by the linker.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/float_types.h"
#include "tensor/nn_kernels.h"

namespace dpar::cpu {
namespace {

// The gradient at the activation's input y, from the gradient dz at its output. The formulas
// (and their float operations) are the unary kernels' for ReLU and Hardswish, so the fused
// backward gives the results of the separate ops.
// The middle piece is computed unconditionally, so that with -fno-trapping-math (set for this
// file in lib/CMakeLists.txt) GCC turns the selects into vector blends: the branchy loops ran
// up to ten times slower on random signs.
template <Activation Act>
inline float act_grad(float dz, float y) {
  if constexpr (Act == Activation::relu) return y <= 0.f ? 0.f : dz;
  if constexpr (Act == Activation::hardswish) {
    const float mid = dz * (y / 3.f + 0.5f);
    return y < -3.f ? 0.f : (y <= 3.f ? mid : dz);
  }
  return dz;
}

template <class T>
struct BnBackwardArgs {
  const T* y;
  const T* dz;
  T* dx;
  bool nhwc;
  int64_t N, C, HW;
  std::vector<float> shift, inv_scale, gain;  // x_hat = (y - shift) * inv_scale; dx = gain * ..
};

// Per-channel sums of dy and dy * x_hat over a contiguous (NCHW) or channels-last y. Each
// thread sums a fixed static share into its own row and the rows are added in thread order,
// so the result is the same on every run.
template <Activation Act, class T>
void sum_dy_and_dy_xhat(const BnBackwardArgs<T>& a, std::vector<double>& sum_dy,
                        std::vector<double>& sum_dy_xhat) {
  const int threads = omp_get_max_threads();
  const int64_t C = a.C, HW = a.HW, N = a.N;
  const size_t uC = static_cast<size_t>(C);
  std::vector<double> part(static_cast<size_t>(2 * threads) * uC, 0.0);
  // __restrict: nothing written aliases the inputs, so the channel loops vectorise.
  const float* __restrict shift = a.shift.data();
  const float* __restrict inv_scale = a.inv_scale.data();
#pragma omp parallel num_threads(threads)
  {
    double* __restrict s1 = part.data() + static_cast<size_t>(2 * omp_get_thread_num()) * uC;
    double* __restrict s2 = s1 + uC;
    if (a.nhwc) {
      // Rows are summed in float over blocks of kBlockRows (a vectorised loop over channels),
      // and the blocks in double: float all the way would lose digits over ~10^5 rows.
      constexpr int64_t kBlockRows = 64;
      std::vector<float> b1(uC), b2(uC);
      float* __restrict f1 = b1.data();
      float* __restrict f2 = b2.data();
      const int64_t blocks = (N * HW + kBlockRows - 1) / kBlockRows;
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        std::fill(b1.begin(), b1.end(), 0.f);
        std::fill(b2.begin(), b2.end(), 0.f);
        const int64_t end = std::min(N * HW, (blk + 1) * kBlockRows);
        for (int64_t r = blk * kBlockRows; r < end; ++r) {
          const T* __restrict yr = a.y + r * C;
          const T* __restrict dr = a.dz + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const float yc = to_float(yr[c]);
            const float dy = act_grad<Act>(to_float(dr[c]), yc);
            f1[c] += dy;
            f2[c] += dy * ((yc - shift[c]) * inv_scale[c]);
          }
        }
        for (size_t c = 0; c < uC; ++c) {
          s1[c] += f1[c];
          s2[c] += f2[c];
        }
      }
    } else {
#pragma omp for schedule(static)
      for (int64_t c = 0; c < C; ++c) {
        double sa = 0, sb = 0;
        for (int64_t n = 0; n < N; ++n) {
          const T* __restrict yp = a.y + (n * C + c) * HW;
          const T* __restrict dp = a.dz + (n * C + c) * HW;
          float pa = 0, pb = 0;  // one plane in float, vectorised; planes added in double
#pragma omp simd reduction(+ : pa, pb)
          for (int64_t p = 0; p < HW; ++p) {
            const float yv = to_float(yp[p]);
            const float dy = act_grad<Act>(to_float(dp[p]), yv);
            pa += dy;
            pb += dy * ((yv - shift[c]) * inv_scale[c]);
          }
          sa += pa;
          sb += pb;
        }
        s1[c] = sa;
        s2[c] = sb;
      }
    }
  }
  sum_dy.assign(uC, 0.0);
  sum_dy_xhat.assign(uC, 0.0);
  for (int t = 0; t < threads; ++t) {
    const double* s1 = part.data() + static_cast<size_t>(2 * t) * uC;
    for (size_t c = 0; c < uC; ++c) {
      sum_dy[c] += s1[c];
      sum_dy_xhat[c] += s1[uC + c];
    }
  }
}

// dx = gain * (dy - mean_dy - x_hat * mean_dy_xhat), dy formed again from dz and y.
template <Activation Act, class T>
void write_dx(const BnBackwardArgs<T>& a, const std::vector<float>& mean_dy,
              const std::vector<float>& mean_dy_xhat) {
  const int64_t C = a.C, HW = a.HW, N = a.N;
  const float* __restrict shift = a.shift.data();
  const float* __restrict inv_scale = a.inv_scale.data();
  const float* __restrict gain = a.gain.data();
  const float* __restrict m1 = mean_dy.data();
  const float* __restrict m2 = mean_dy_xhat.data();
  const T* __restrict y = a.y;
  const T* __restrict dz = a.dz;
  T* __restrict dx = a.dx;
  if (a.nhwc) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * HW; ++r) {
      // Row pointers local to the loop body: the vectoriser cannot see through the shared
      // variables OpenMP passes to the outlined function.
      const T* __restrict yr = y + r * C;
      const T* __restrict dr = dz + r * C;
      T* __restrict xr = dx + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float yc = to_float(yr[c]);
        const float xh = (yc - shift[c]) * inv_scale[c];
        xr[c] = from_float<T>(gain[c] * (act_grad<Act>(to_float(dr[c]), yc) - m1[c] - xh * m2[c]));
      }
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < N * C; ++plane) {
      const int64_t c = plane % C;
      const int64_t o = plane * HW;
      const float sh = shift[c], is = inv_scale[c], g = gain[c], a1 = m1[c], a2 = m2[c];
      const T* __restrict yp = y + o;
      const T* __restrict dp = dz + o;
      T* __restrict xp = dx + o;
#pragma omp simd
      for (int64_t p = 0; p < HW; ++p) {
        const float yv = to_float(yp[p]);
        const float xh = (yv - sh) * is;
        xp[p] = from_float<T>(g * (act_grad<Act>(to_float(dp[p]), yv) - a1 - xh * a2));
      }
    }
  }
}

template <Activation Act, class T>
void bn_backward_from_output(const BnBackwardArgs<T>& a, bool use_batch_stats, Tensor& dweight,
                             Tensor& dbias) {
  const size_t uC = static_cast<size_t>(a.C);
  std::vector<double> sum_dy, sum_dy_xhat;
  sum_dy_and_dy_xhat<Act, T>(a, sum_dy, sum_dy_xhat);
  if (dweight.defined()) {
    for (size_t c = 0; c < uC; ++c) dweight.data<float>()[c] = static_cast<float>(sum_dy_xhat[c]);
  }
  if (dbias.defined()) {
    for (size_t c = 0; c < uC; ++c) dbias.data<float>()[c] = static_cast<float>(sum_dy[c]);
  }
  // With batch statistics the mean and variance depend on x too: subtract the mean of dy and
  // the x_hat-projection of dy (the standard batch-norm backward); with running statistics
  // they are constants.
  std::vector<float> mean_dy(uC, 0.f), mean_dy_xhat(uC, 0.f);
  if (use_batch_stats) {
    const double M = static_cast<double>(a.N * a.HW);
    for (size_t c = 0; c < uC; ++c) {
      mean_dy[c] = static_cast<float>(sum_dy[c] / M);
      mean_dy_xhat[c] = static_cast<float>(sum_dy_xhat[c] / M);
    }
  }
  write_dx<Act, T>(a, mean_dy, mean_dy_xhat);
}

template <class T>
void bn_backward_from_output_typed(const Tensor& y, const Tensor& dz, const Tensor& weight,
                                   const Tensor& bias, const Tensor& var, bool use_batch_stats,
                                   double eps, Activation act, Tensor& dx, Tensor& dweight,
                                   Tensor& dbias) {
  BnBackwardArgs<T> a{data_as<const T>(y),
                      data_as<const T>(dz),
                      data_as<T>(dx),
                      y.is_contiguous(MemoryFormat::ChannelsLast) && !y.is_contiguous(),
                      y.size(0),
                      y.size(1),
                      y.size(2) * y.size(3),
                      {},
                      {},
                      {}};
  const size_t uC = static_cast<size_t>(a.C);
  a.shift.assign(uC, 0.f);
  a.inv_scale.assign(uC, 1.f);
  a.gain.resize(uC);
  const float* w = weight.defined() ? weight.data<float>() : nullptr;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  const float* v = var.data<float>();
  for (size_t c = 0; c < uC; ++c) {
    const float scale = w ? w[c] : 1.f;
    if (b) a.shift[c] = b[c];
    a.inv_scale[c] = 1.f / scale;
    a.gain[c] = scale / std::sqrt(v[c] + static_cast<float>(eps));
  }
  switch (act) {
    case Activation::none:
      return bn_backward_from_output<Activation::none>(a, use_batch_stats, dweight, dbias);
    case Activation::relu:
      return bn_backward_from_output<Activation::relu>(a, use_batch_stats, dweight, dbias);
    case Activation::hardswish:
      return bn_backward_from_output<Activation::hardswish>(a, use_batch_stats, dweight, dbias);
  }
}

// The forward: the statistics in one pass over x (channel_moments), then
// y = x * scale + shift with scale = weight / sqrt(var + eps), shift = bias - mean * scale.
struct Layout {
  bool nhwc;
  int64_t N, C, HW;
};

// Per-channel sums of d = x - k[c] and of d * d over N, H and W, in one pass over x, in double:
// rows of a channels-last x are summed in f32 over blocks of 64 rows (a vectorised loop over
// channels) and the blocks in double; each thread sums a fixed static share and the shares are
// added in thread order. k is one of the channel's own values, so |mean - k| is of the order of
// the standard deviation and var = E[d^2] - E[d]^2 keeps its digits (the shifted-data
// algorithm), where E[x^2] - E[x]^2 would cancel them when the mean is large.
template <class T>
void channel_moments(const T* x, const Layout& l, const float* k, std::vector<double>& sum_d,
                     std::vector<double>& sum_d2) {
  const int threads = omp_get_max_threads();
  const size_t uC = static_cast<size_t>(l.C);
  std::vector<double> part(static_cast<size_t>(2 * threads) * uC, 0.0);
#pragma omp parallel num_threads(threads)
  {
    double* __restrict s1 = part.data() + static_cast<size_t>(2 * omp_get_thread_num()) * uC;
    double* __restrict s2 = s1 + uC;
    if (l.nhwc) {
      constexpr int64_t kBlockRows = 64;
      std::vector<float> blocks1(uC), blocks2(uC);
      float* __restrict b1 = blocks1.data();
      float* __restrict b2 = blocks2.data();
      const int64_t rows = l.N * l.HW, blocks = (rows + kBlockRows - 1) / kBlockRows;
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        std::fill(blocks1.begin(), blocks1.end(), 0.f);
        std::fill(blocks2.begin(), blocks2.end(), 0.f);
        const int64_t end = std::min(rows, (blk + 1) * kBlockRows);
        for (int64_t r = blk * kBlockRows; r < end; ++r) {
          const T* __restrict row = x + r * l.C;
#pragma omp simd
          for (int64_t c = 0; c < l.C; ++c) {
            const float d = to_float(row[c]) - k[c];
            b1[c] += d;
            b2[c] += d * d;
          }
        }
        for (size_t c = 0; c < uC; ++c) {
          s1[c] += b1[c];
          s2[c] += b2[c];
        }
      }
    } else {
#pragma omp for schedule(static)
      for (int64_t c = 0; c < l.C; ++c) {
        double a1 = 0, a2 = 0;
        for (int64_t n = 0; n < l.N; ++n) {
          const T* __restrict plane = x + (n * l.C + c) * l.HW;
          float p1 = 0, p2 = 0;  // one plane in f32, vectorised; planes added in double
#pragma omp simd reduction(+ : p1, p2)
          for (int64_t i = 0; i < l.HW; ++i) {
            const float d = to_float(plane[i]) - k[c];
            p1 += d;
            p2 += d * d;
          }
          a1 += p1;
          a2 += p2;
        }
        s1[c] = a1;
        s2[c] = a2;
      }
    }
  }
  sum_d.assign(uC, 0.0);
  sum_d2.assign(uC, 0.0);
  for (int t = 0; t < threads; ++t) {
    const double* s1 = part.data() + static_cast<size_t>(2 * t) * uC;
    for (size_t c = 0; c < uC; ++c) {
      sum_d[c] += s1[c];
      sum_d2[c] += s1[uC + c];
    }
  }
}

template <class T>
void normalize(const T* x, T* y, const Layout& l, const std::vector<float>& scale_v,
               const std::vector<float>& shift_v) {
  const float* __restrict scale = scale_v.data();
  const float* __restrict shift = shift_v.data();
  if (l.nhwc) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < l.N * l.HW; ++r) {
      const T* __restrict xr = x + r * l.C;
      T* __restrict yr = y + r * l.C;
#pragma omp simd
      for (int64_t c = 0; c < l.C; ++c)
        yr[c] = from_float<T>(to_float(xr[c]) * scale[c] + shift[c]);
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t plane = 0; plane < l.N * l.C; ++plane) {
    const int64_t c = plane % l.C;
    const float a = scale[c], b = shift[c];
    const T* __restrict xp = x + plane * l.HW;
    T* __restrict yp = y + plane * l.HW;
#pragma omp simd
    for (int64_t i = 0; i < l.HW; ++i) yp[i] = from_float<T>(to_float(xp[i]) * a + b);
  }
}

template <class T>
void batch_norm_forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              Tensor& mean, Tensor& var, bool use_batch_stats, double eps,
                              Tensor& y) {
  const Layout l{x.is_contiguous(MemoryFormat::ChannelsLast), x.size(0), x.size(1),
                 x.size(2) * x.size(3)};
  const T* px = data_as<const T>(x);
  const size_t uC = static_cast<size_t>(l.C);
  float* pm = mean.data<float>();
  float* pv = var.data<float>();
  if (use_batch_stats) {
    // The shift: each channel's first value (element [0, c, 0, 0] in either layout).
    std::vector<float> k(uC);
    for (size_t c = 0; c < uC; ++c) k[c] = to_float(px[l.nhwc ? c : c * l.HW]);
    std::vector<double> sum_d, sum_d2;
    channel_moments(px, l, k.data(), sum_d, sum_d2);
    const double M = static_cast<double>(l.N * l.HW);
    for (size_t c = 0; c < uC; ++c) {
      const double mean_d = sum_d[c] / M;
      pm[c] = static_cast<float>(k[c] + mean_d);
      pv[c] = static_cast<float>(std::max(0.0, sum_d2[c] / M - mean_d * mean_d));
    }
  }
  std::vector<float> scale(uC), shift(uC);
  const float* w = weight.defined() ? weight.data<float>() : nullptr;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  for (size_t c = 0; c < uC; ++c) {
    const float inv_std = 1.f / std::sqrt(pv[c] + static_cast<float>(eps));
    scale[c] = (w ? w[c] : 1.f) * inv_std;
    shift[c] = (b ? b[c] : 0.f) - pm[c] * scale[c];
  }
  normalize(px, data_as<T>(y), l, scale, shift);
}

}  // namespace
}  // namespace dpar::cpu
