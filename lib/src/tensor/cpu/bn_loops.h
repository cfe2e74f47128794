#pragma once
// The batch-norm loops dpar runs itself on the CPU, templated on the activations' storage type
// (float, or BF16 for amp::Autocast's activations; statistics and parameters in f32):
//   - the backward from the forward output (kernel slot batch_norm_backward_from_output), for
//     f32 and bf16;
//   - the backward from the input with the activation fused (batch_norm_act_backward), whose
//     forward writes only act(y), for f32;
//   - the forward (batch statistics or running ones) with an activation fused in, for f32 and
//     bf16. oneDNN 2.6 has a bf16 jit kernel only for channel counts that are multiples of 16
//     (the others, MobileNetV3's 24, 40, 72, 88 and 120, fell to its generic nspc kernel: 4-10
//     ms per layer at batch 16 on one thread), and its f32 one makes three passes over x.
// Everything is in an unnamed namespace: each file that includes this gets its own copies,
// compiled for the ISA in force where it is included. norm_kernels.cpp includes it for the x86-64
// baseline, avx512_bf16_kernels.cpp for AVX-512 (the bf16 path of a CPU without AVX512-BF16,
// or with DPAR_CPU_ISA=avx512), bn_bf16_native_kernels.cpp for AVX512-BF16 (the bf16 path,
// rounding with its instruction) and
// bn_isa_kernels.inc for AVX2 and AVX-512 (the f32 path), and the copies must never be merged
// by the linker.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cpu/float_types.h"
#include "tensor/nn_kernels.h"
#include "tensor/unary_math.h"

namespace dpar::cpu {
namespace {

// The gradient at the activation's input y, from the gradient dz at its output: the unary
// kernels' formulas for ReLU and Hardswish, except that Hardswish's y / 3 is y * (1/3) (within
// an ulp of it). A division is the slowest vector instruction on these cores, and the backward
// of the small layers, whose data stays in cache, is bound by its arithmetic (240 channels at
// 14x14, batch 16: ~20% of the loop's time was the division).
// The middle piece is computed unconditionally, so that with -fno-trapping-math (set for this
// file in lib/CMakeLists.txt) GCC turns the selects into vector blends: the branchy loops ran
// up to ten times slower on random signs.
template <Activation Act>
inline float act_grad(float dz, float y) {
  if constexpr (Act == Activation::relu) return y <= 0.f ? 0.f : dz;
  if constexpr (Act == Activation::hardswish) {
    const float mid = dz * (y * (1.f / 3.f) + 0.5f);
    return y < -3.f ? 0.f : (y <= 3.f ? mid : dz);
  }
  return dz;
}

// The activation itself, by the unary kernels' formula (tensor/unary_math.h).
template <Activation Act>
inline float activation(float y) {
  if constexpr (Act == Activation::relu) return kernels::unary_value<kernels::UnaryOp::relu>(y);
  if constexpr (Act == Activation::hardswish)
    return kernels::unary_value<kernels::UnaryOp::hardswish>(y);
  return y;
}

// A 4-D activation's layout as the loops below walk it: channels-last (rows of C channels) or
// contiguous NCHW (planes of H*W values).
struct Layout {
  bool nhwc;
  int64_t N, C, HW;
};

// A tensor that is both contiguous and channels-last (H = W = 1, or C = 1: the same memory
// either way) is walked as rows of channels where H = W = 1 and as NCHW planes otherwise: as
// planes, an H = W = 1 tensor (MobileNetV3's last blocks on 32 px images) was one element a
// plane, and the bf16 forward took 5x f32's time there.
inline Layout layout_of(const Tensor& t) {
  const int64_t HW = t.size(2) * t.size(3);
  const bool nhwc = t.is_contiguous(MemoryFormat::ChannelsLast) && (!t.is_contiguous() || HW == 1);
  return {nhwc, t.size(0), t.size(1), HW};
}

struct SumPair {
  float a, b;
};

// v's C per-channel values repeated over len / C rows (channels-last), or v unchanged (NCHW,
// where a loop reads its channel's value at offset c).
inline std::vector<float> repeat_rows(const std::vector<float>& v, const Layout& l, int64_t len) {
  if (!l.nhwc || v.empty()) return v;
  std::vector<float> r(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) r[static_cast<size_t>(i)] = v[static_cast<size_t>(i % l.C)];
  return r;
}

// The length of channel_sum_pair's runs of channels-last rows: the fewest whole rows that fill
// whole 16-lane vectors, or one row where that would pass 1024 values (a large odd C); C for
// NCHW.
inline int64_t sum_run_len(const Layout& l) {
  if (!l.nhwc) return l.C;
  int64_t rows = 1;
  while (rows * l.C % 16 != 0) rows *= 2;
  return rows * l.C <= 1024 ? rows * l.C : l.C;
}

// Per-channel sums of term(i, j).a and term(i, j).b over N, H and W, in double, where i is an
// element's offset in a tensor of layout l and j indexes its channel's values: its channel
// (NCHW), or its offset in a run of sum_run_len(l) channels-last elements, whose per-channel
// values the term repeats row by row (repeat_rows). Rows of a channels-last tensor are summed
// in f32 over blocks of 64, a run of rows at a time as one flat vectorised loop (one loop per row
// left each row of C = 24, 40, 72, 88 or 120 channels ending in a partial vector), the run's
// copies of a channel added at the end of the block, and the blocks in double: f32 all the way
// would lose digits over ~10^5 rows. NCHW planes are summed in f32 and added in double. Each
// thread sums a fixed static share into its own row and the rows are added in thread order, so
// the result is the same on every run.
template <class Term>
void channel_sum_pair(const Layout& l, Term term, std::vector<double>& sum_a,
                      std::vector<double>& sum_b) {
  const int threads = omp_get_max_threads();
  const int64_t C = l.C, HW = l.HW, N = l.N;
  const size_t uC = static_cast<size_t>(C);
  std::vector<double> part(static_cast<size_t>(2 * threads) * uC, 0.0);
#pragma omp parallel num_threads(threads)
  {
    double* __restrict s1 = part.data() + static_cast<size_t>(2 * omp_get_thread_num()) * uC;
    double* __restrict s2 = s1 + uC;
    if (l.nhwc) {
      constexpr int64_t kBlockRows = 64;
      const int64_t len = sum_run_len(l), run_rows = len / C;  // run_rows divides 64
      std::vector<float> b1(static_cast<size_t>(len)), b2(static_cast<size_t>(len));
      float* __restrict f1 = b1.data();
      float* __restrict f2 = b2.data();
      const int64_t blocks = (N * HW + kBlockRows - 1) / kBlockRows;
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        std::fill(b1.begin(), b1.end(), 0.f);
        std::fill(b2.begin(), b2.end(), 0.f);
        const int64_t end = std::min(N * HW, (blk + 1) * kBlockRows);
        int64_t r = blk * kBlockRows;
        for (; r + run_rows <= end; r += run_rows) {
          const int64_t base = r * C;
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) {
            const SumPair t = term(base + j, j);
            f1[j] += t.a;
            f2[j] += t.b;
          }
        }
        for (; r < end; ++r) {  // the last block's rows short of a run
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const SumPair t = term(r * C + c, c);
            f1[c] += t.a;
            f2[c] += t.b;
          }
        }
        for (int64_t q = 1; q < run_rows; ++q) {
          for (int64_t c = 0; c < C; ++c) {
            f1[c] += f1[q * C + c];
            f2[c] += f2[q * C + c];
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
          const int64_t plane = (n * C + c) * HW;
          float pa = 0, pb = 0;
#pragma omp simd reduction(+ : pa, pb)
          for (int64_t p = 0; p < HW; ++p) {
            const SumPair t = term(plane + p, c);
            pa += t.a;
            pb += t.b;
          }
          sa += pa;
          sb += pb;
        }
        s1[c] = sa;
        s2[c] = sb;
      }
    }
  }
  sum_a.assign(uC, 0.0);
  sum_b.assign(uC, 0.0);
  for (int t = 0; t < threads; ++t) {
    const double* s1 = part.data() + static_cast<size_t>(2 * t) * uC;
    for (size_t c = 0; c < uC; ++c) {
      sum_a[c] += s1[c];
      sum_b[c] += s1[uC + c];
    }
  }
}

// The backward's source: the forward's output y (Source::output, x_hat = (y - bias) / weight)
// or its input x (Source::input, x_hat = (x - mean) * inv_std, and the activation's input y
// formed again from x as the forward formed it).
enum class Source { output, input };

template <class T>
struct BnBackwardArgs {
  const T* src;  // y or x
  const T* dz;
  T* dx;
  Layout l;
  std::vector<float> shift, inv_scale, gain;  // x_hat = (src - shift) * inv_scale; dx = gain * ..
  std::vector<float> act_scale, act_shift;    // Source::input: y = src * act_scale + act_shift
};

// The activation's input y at element value v of channel c: v itself, or the forward's
// y = v * scale + shift rounded to T, so the activation's gradient sees the forward's y.
template <Source S, class T>
inline float act_input(float v, const float* scale, const float* shift, int64_t c) {
  if constexpr (S == Source::input) return rounded<T>(v * scale[c] + shift[c]);
  return v;
}

// The loops below write T one element at a time, rounding each f32 result inline (Store =
// void). A Store class instead rounds a run of f32 values itself, Store::store(const float*,
// T*, n): the CPU's bf16 conversion instruction (bn_bf16_native_kernels.cpp), which the
// vectoriser never emits, where the inline rounding costs more than the rest of the loop. Its
// loops form the same f32 values by the same expressions into a per-thread buffer that stays
// in L1, so the results have the same bits.
//
// Runs of kStoreRun elements or fewer: whole rows of a channels-last tensor (its per-channel
// values repeated row by row, so the run is one flat loop; one row where C is larger), or a
// piece of an NCHW plane.
constexpr int64_t kStoreRun = 1024;

struct StoreRuns {
  int64_t len, count, per_plane;  // per_plane: NCHW runs per plane (0 channels-last)
};

inline StoreRuns store_runs(const Layout& l) {
  if (l.nhwc) {
    const int64_t rows = std::max<int64_t>(1, kStoreRun / l.C);
    return {rows * l.C, (l.N * l.HW + rows - 1) / rows, 0};
  }
  const int64_t per_plane = (l.HW + kStoreRun - 1) / kStoreRun;
  return {kStoreRun, l.N * l.C * per_plane, per_plane};
}

// Calls body(begin, n, c, f) for each run: its first element, its length, the offset of its
// per-channel values (0 for repeated rows, which start with the run; an NCHW plane's channel)
// and the calling thread's f32 buffer of runs.len values.
template <class Body>
void for_each_store_run(const Layout& l, const StoreRuns& runs, Body body) {
  const int64_t total = l.N * l.C * l.HW;
#pragma omp parallel
  {
    std::vector<float> f(static_cast<size_t>(runs.len));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < runs.count; ++b) {
      if (l.nhwc) {
        const int64_t begin = b * runs.len;
        body(begin, std::min(runs.len, total - begin), int64_t{0}, f.data());
      } else {
        const int64_t plane = b / runs.per_plane;
        const int64_t begin = plane * l.HW + (b % runs.per_plane) * runs.len;
        body(begin, std::min(runs.len, (plane + 1) * l.HW - begin), plane % l.C, f.data());
      }
    }
  }
}

// v's values from offset c, or null where v is empty (Source::output has no activation map).
inline const float* from_offset(const std::vector<float>& v, int64_t c) {
  return v.empty() ? nullptr : v.data() + c;
}

// Index of a per-channel value in a run: element i of the repeated rows (channels-last), or
// the run's one channel value (NCHW).
template <bool Rows>
inline int64_t at(int64_t i) {
  return Rows ? i : 0;
}

// Per-channel sums of dy and dy * x_hat, dy formed from dz and y.
template <Activation Act, Source S, class T>
void sum_dy_and_dy_xhat(const BnBackwardArgs<T>& a, std::vector<double>& sum_dy,
                        std::vector<double>& sum_dy_xhat) {
  // __restrict: nothing written aliases the inputs, so the channel loops vectorise.
  const T* __restrict src = a.src;
  const T* __restrict dz = a.dz;
  const int64_t len = sum_run_len(a.l);
  const std::vector<float> shift_runs = repeat_rows(a.shift, a.l, len);
  const std::vector<float> inv_scale_runs = repeat_rows(a.inv_scale, a.l, len);
  const std::vector<float> act_scale_runs = repeat_rows(a.act_scale, a.l, len);
  const std::vector<float> act_shift_runs = repeat_rows(a.act_shift, a.l, len);
  const float* __restrict shift = shift_runs.data();
  const float* __restrict inv_scale = inv_scale_runs.data();
  const float* __restrict act_scale = act_scale_runs.data();
  const float* __restrict act_shift = act_shift_runs.data();
  channel_sum_pair(
      a.l,
      [=](int64_t i, int64_t c) {
        const float v = to_float(src[i]);
        const float dy =
            act_grad<Act>(to_float(dz[i]), act_input<S, T>(v, act_scale, act_shift, c));
        return SumPair{dy, dy * ((v - shift[c]) * inv_scale[c])};
      },
      sum_dy, sum_dy_xhat);
}

// write_dx's formula over a run of n elements from element 0 of src/dz (per-channel values at
// p.*[at<Rows>(i)]), rounded by Store into dx.
struct DxValues {
  const float *shift, *inv_scale, *gain, *m1, *m2, *act_scale, *act_shift;
};

template <Activation Act, Source S, class Store, bool Rows, class T>
void write_dx_run(const T* __restrict src, const T* __restrict dz, T* dx, int64_t n,
                  const DxValues& p, float* __restrict f) {
  const float* __restrict shift = p.shift;
  const float* __restrict inv_scale = p.inv_scale;
  const float* __restrict gain = p.gain;
  const float* __restrict m1 = p.m1;
  const float* __restrict m2 = p.m2;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = at<Rows>(i);
    const float v = to_float(src[i]);
    const float xh = (v - shift[c]) * inv_scale[c];
    const float dy =
        act_grad<Act>(to_float(dz[i]), act_input<S, T>(v, p.act_scale, p.act_shift, c));
    f[i] = gain[c] * (dy - m1[c] - xh * m2[c]);
  }
  Store::store(f, dx, n);
}

template <Activation Act, Source S, class Store, class T>
void write_dx_stored(const BnBackwardArgs<T>& a, const std::vector<float>& mean_dy,
                     const std::vector<float>& mean_dy_xhat) {
  const StoreRuns runs = store_runs(a.l);
  const auto shift = repeat_rows(a.shift, a.l, runs.len);
  const auto inv_scale = repeat_rows(a.inv_scale, a.l, runs.len);
  const auto gain = repeat_rows(a.gain, a.l, runs.len);
  const auto m1 = repeat_rows(mean_dy, a.l, runs.len);
  const auto m2 = repeat_rows(mean_dy_xhat, a.l, runs.len);
  const auto act_scale = repeat_rows(a.act_scale, a.l, runs.len);
  const auto act_shift = repeat_rows(a.act_shift, a.l, runs.len);
  for_each_store_run(a.l, runs, [&](int64_t begin, int64_t n, int64_t c, float* f) {
    const DxValues p{from_offset(shift, c),    from_offset(inv_scale, c), from_offset(gain, c),
                     from_offset(m1, c),       from_offset(m2, c),        from_offset(act_scale, c),
                     from_offset(act_shift, c)};
    if (a.l.nhwc) {
      write_dx_run<Act, S, Store, true>(a.src + begin, a.dz + begin, a.dx + begin, n, p, f);
    } else {
      write_dx_run<Act, S, Store, false>(a.src + begin, a.dz + begin, a.dx + begin, n, p, f);
    }
  });
}

// dx = gain * (dy - mean_dy - x_hat * mean_dy_xhat), dy formed again from dz and y.
template <Activation Act, Source S, class Store, class T>
void write_dx(const BnBackwardArgs<T>& a, const std::vector<float>& mean_dy,
              const std::vector<float>& mean_dy_xhat) {
  if constexpr (!std::is_void_v<Store>) {
    return write_dx_stored<Act, S, Store>(a, mean_dy, mean_dy_xhat);
  } else {
    const int64_t C = a.l.C, HW = a.l.HW, N = a.l.N;
    const float* __restrict shift = a.shift.data();
    const float* __restrict inv_scale = a.inv_scale.data();
    const float* __restrict gain = a.gain.data();
    const float* __restrict act_scale = a.act_scale.data();
    const float* __restrict act_shift = a.act_shift.data();
    const float* __restrict m1 = mean_dy.data();
    const float* __restrict m2 = mean_dy_xhat.data();
    const T* __restrict src = a.src;
    const T* __restrict dz = a.dz;
    T* __restrict dx = a.dx;
    if (a.l.nhwc) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < N * HW; ++r) {
        // Row pointers local to the loop body: the vectoriser cannot see through the shared
        // variables OpenMP passes to the outlined function.
        const T* __restrict sr = src + r * C;
        const T* __restrict dr = dz + r * C;
        T* __restrict xr = dx + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float v = to_float(sr[c]);
          const float xh = (v - shift[c]) * inv_scale[c];
          const float dy =
              act_grad<Act>(to_float(dr[c]), act_input<S, T>(v, act_scale, act_shift, c));
          xr[c] = from_float<T>(gain[c] * (dy - m1[c] - xh * m2[c]));
        }
      }
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t plane = 0; plane < N * C; ++plane) {
        const int64_t c = plane % C;
        const int64_t o = plane * HW;
        const float sh = shift[c], is = inv_scale[c], g = gain[c], a1 = m1[c], a2 = m2[c];
        const T* __restrict sp = src + o;
        const T* __restrict dp = dz + o;
        T* __restrict xp = dx + o;
#pragma omp simd
        for (int64_t p = 0; p < HW; ++p) {
          const float v = to_float(sp[p]);
          const float xh = (v - sh) * is;
          const float dy =
              act_grad<Act>(to_float(dp[p]), act_input<S, T>(v, act_scale, act_shift, c));
          xp[p] = from_float<T>(g * (dy - a1 - xh * a2));
        }
      }
    }
  }
}

template <Activation Act, Source S, class Store, class T>
void bn_backward(const BnBackwardArgs<T>& a, bool use_batch_stats, Tensor& dweight, Tensor& dbias) {
  const size_t uC = static_cast<size_t>(a.l.C);
  std::vector<double> sum_dy, sum_dy_xhat;
  sum_dy_and_dy_xhat<Act, S, T>(a, sum_dy, sum_dy_xhat);
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
    const double M = static_cast<double>(a.l.N * a.l.HW);
    for (size_t c = 0; c < uC; ++c) {
      mean_dy[c] = static_cast<float>(sum_dy[c] / M);
      mean_dy_xhat[c] = static_cast<float>(sum_dy_xhat[c] / M);
    }
  }
  write_dx<Act, S, Store>(a, mean_dy, mean_dy_xhat);
}

template <Source S, class Store, class T>
void bn_backward_for(Activation act, const BnBackwardArgs<T>& a, bool use_batch_stats,
                     Tensor& dweight, Tensor& dbias) {
  switch (act) {
    case Activation::none:
      return bn_backward<Activation::none, S, Store>(a, use_batch_stats, dweight, dbias);
    case Activation::relu:
      return bn_backward<Activation::relu, S, Store>(a, use_batch_stats, dweight, dbias);
    case Activation::hardswish:
      return bn_backward<Activation::hardswish, S, Store>(a, use_batch_stats, dweight, dbias);
  }
}

// The forward's y = x * scale + shift per channel: scale = weight / sqrt(var + eps),
// shift = bias - mean * scale (as PyTorch's CPU kernel forms them). The forward, the
// recomputation of act(y) and the backward from the input all take them from here, so they
// agree to the bit.
inline void bn_affine(const Tensor& weight, const Tensor& bias, const float* mean, const float* var,
                      double eps, std::vector<float>& scale, std::vector<float>& shift) {
  const float* w = weight.defined() ? weight.data<float>() : nullptr;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  for (size_t c = 0; c < scale.size(); ++c) {
    const float inv_std = 1.f / std::sqrt(var[c] + static_cast<float>(eps));
    scale[c] = (w ? w[c] : 1.f) * inv_std;
    shift[c] = (b ? b[c] : 0.f) - mean[c] * scale[c];
  }
}

template <class T, class Store = void>
void bn_backward_from_output_typed(const Tensor& y, const Tensor& dz, const Tensor& weight,
                                   const Tensor& bias, const Tensor& var, bool use_batch_stats,
                                   double eps, Activation act, Tensor& dx, Tensor& dweight,
                                   Tensor& dbias) {
  BnBackwardArgs<T> a{
      data_as<const T>(y), data_as<const T>(dz), data_as<T>(dx), layout_of(y), {}, {}, {}, {}, {}};
  const size_t uC = static_cast<size_t>(a.l.C);
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
  bn_backward_for<Source::output, Store>(act, a, use_batch_stats, dweight, dbias);
}

// The backward from the input x with the activation fused, for the forward that wrote only
// z = act(y): y is formed again from x with the forward's bn_affine, the activation's gradient
// from it, x_hat = (x - mean) * inv_std.
template <class T>
void bn_act_backward_from_input_typed(const Tensor& x, const Tensor& dz, const Tensor& weight,
                                      const Tensor& bias, const Tensor& mean, const Tensor& var,
                                      bool use_batch_stats, double eps, Activation act, Tensor& dx,
                                      Tensor& dweight, Tensor& dbias) {
  BnBackwardArgs<T> a{
      data_as<const T>(x), data_as<const T>(dz), data_as<T>(dx), layout_of(x), {}, {}, {}, {}, {}};
  const size_t uC = static_cast<size_t>(a.l.C);
  const float* m = mean.data<float>();
  const float* v = var.data<float>();
  a.act_scale.resize(uC);
  a.act_shift.resize(uC);
  bn_affine(weight, bias, m, v, eps, a.act_scale, a.act_shift);
  a.shift.assign(m, m + uC);
  a.inv_scale.resize(uC);
  a.gain.resize(uC);
  const float* w = weight.defined() ? weight.data<float>() : nullptr;
  for (size_t c = 0; c < uC; ++c) {
    a.inv_scale[c] = 1.f / std::sqrt(v[c] + static_cast<float>(eps));
    a.gain[c] = (w ? w[c] : 1.f) * a.inv_scale[c];
  }
  bn_backward_for<Source::input, void>(act, a, use_batch_stats, dweight, dbias);
}

// normalize's formulas over a run of n elements, rounded by Store: y into y (KeepY; else into
// z, which act(y) then overwrites), act(y) from y's stored value into z. A Store with its own
// normalize<Act, KeepY, Rows>(x, y, z, n, scale, shift) does all of it in one pass, with the
// same bits (the native one where it is built with its AVX-512 code; the loops below otherwise).
template <Activation Act, bool KeepY, class Store, bool Rows, class T>
void normalize_run(const T* __restrict x, T* y, T* z, int64_t n, const float* scale,
                   const float* shift, float* __restrict f) {
  if constexpr (requires {
                  Store::template normalize<Act, KeepY, Rows>(x, y, z, n, scale, shift);
                }) {
    return Store::template normalize<Act, KeepY, Rows>(x, y, z, n, scale, shift);
  } else {
    T* yo = KeepY ? y : z;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) f[i] = to_float(x[i]) * scale[at<Rows>(i)] + shift[at<Rows>(i)];
    Store::store(f, yo, n);
    if constexpr (Act != Activation::none) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) f[i] = activation<Act>(to_float(yo[i]));
      Store::store(f, z, n);
    }
  }
}

template <Activation Act, bool KeepY, class Store, class T>
void normalize_stored(const T* x, T* y, T* z, const Layout& l, const std::vector<float>& scale_v,
                      const std::vector<float>& shift_v) {
  const StoreRuns runs = store_runs(l);
  const auto scale = repeat_rows(scale_v, l, runs.len);
  const auto shift = repeat_rows(shift_v, l, runs.len);
  for_each_store_run(l, runs, [&](int64_t begin, int64_t n, int64_t c, float* f) {
    T* yb = KeepY ? y + begin : nullptr;
    if (l.nhwc) {
      normalize_run<Act, KeepY, Store, true>(x + begin, yb, z + begin, n, scale.data(),
                                             shift.data(), f);
    } else {
      normalize_run<Act, KeepY, Store, false>(x + begin, yb, z + begin, n, scale.data() + c,
                                              shift.data() + c, f);
    }
  });
}

// The forward: the statistics in one pass over x, then y = x * scale + shift (bn_affine) and
// in the same pass z = act(y) where an activation follows. The fused op writes z, and y only
// where it is wanted (KeepY: the backward from the output keeps it; the backward from the input
// and inference do not); z is formed from y rounded to T by the unary kernels' formula, so it
// has the bits of the separate ops and of a recomputation from y or from x.
// y is held as the f32 value of its T rounding, not as a T: a T (BF16, a struct) local that is
// both stored and read again made GCC's omp simd keep it in a per-lane array, and the loop
// stayed scalar (the bf16 forward with an activation ran ~8x slower than its vector form).
// Converting the rounded value back to T is exact, so the bits are those of one rounding.
template <Activation Act, bool KeepY, class Store, class T>
void normalize(const T* x, T* y, T* z, const Layout& l, const std::vector<float>& scale_v,
               const std::vector<float>& shift_v) {
  if constexpr (!std::is_void_v<Store>) {
    return normalize_stored<Act, KeepY, Store>(x, y, z, l, scale_v, shift_v);
  } else {
    const float* __restrict scale = scale_v.data();
    const float* __restrict shift = shift_v.data();
    if (l.nhwc) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < l.N * l.HW; ++r) {
        const T* __restrict xr = x + r * l.C;
        T* __restrict yr = y + r * l.C;
        T* __restrict zr = z + r * l.C;
#pragma omp simd
        for (int64_t c = 0; c < l.C; ++c) {
          const float yv = rounded<T>(to_float(xr[c]) * scale[c] + shift[c]);
          if constexpr (KeepY) yr[c] = from_float<T>(yv);
          if constexpr (Act != Activation::none) zr[c] = from_float<T>(activation<Act>(yv));
        }
      }
      return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < l.N * l.C; ++plane) {
      const int64_t c = plane % l.C;
      const float a = scale[c], b = shift[c];
      const T* __restrict xp = x + plane * l.HW;
      T* __restrict yp = y + plane * l.HW;
      T* __restrict zp = z + plane * l.HW;
#pragma omp simd
      for (int64_t i = 0; i < l.HW; ++i) {
        const float yv = rounded<T>(to_float(xp[i]) * a + b);
        if constexpr (KeepY) yp[i] = from_float<T>(yv);
        if constexpr (Act != Activation::none) zp[i] = from_float<T>(activation<Act>(yv));
      }
    }
  }
}

// z (x's strides) receives act(y) when act is not Activation::none; it is unused otherwise.
// y may be undefined where act is not Activation::none: only z is written then.
template <class T, class Store = void>
void batch_norm_forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              Tensor& mean, Tensor& var, bool use_batch_stats, double eps,
                              Activation act, Tensor& y, Tensor& z) {
  const Layout l = layout_of(x);
  const T* px = data_as<const T>(x);
  const size_t uC = static_cast<size_t>(l.C);
  float* pm = mean.data<float>();
  float* pv = var.data<float>();
  if (use_batch_stats) {
    // The shift: each channel's first value (element [0, c, 0, 0] in either layout).
    std::vector<float> k(uC);
    for (size_t c = 0; c < uC; ++c) k[c] = to_float(px[l.nhwc ? c : c * l.HW]);
    // The sums of d = x - k and d * d in one pass. k is one of the channel's own values, so
    // |mean - k| is of the order of the standard deviation and var = E[d^2] - E[d]^2 keeps its
    // digits (the shifted-data algorithm), where E[x^2] - E[x]^2 would cancel them when the mean
    // is large.
    const std::vector<float> k_runs = repeat_rows(k, l, sum_run_len(l));
    const float* __restrict shift = k_runs.data();
    std::vector<double> sum_d, sum_d2;
    channel_sum_pair(
        l,
        [=](int64_t i, int64_t c) {
          const float d = to_float(px[i]) - shift[c];
          return SumPair{d, d * d};
        },
        sum_d, sum_d2);
    const double M = static_cast<double>(l.N * l.HW);
    for (size_t c = 0; c < uC; ++c) {
      const double mean_d = sum_d[c] / M;
      pm[c] = static_cast<float>(k[c] + mean_d);
      pv[c] = static_cast<float>(std::max(0.0, sum_d2[c] / M - mean_d * mean_d));
    }
  }
  std::vector<float> scale(uC), shift(uC);
  bn_affine(weight, bias, pm, pv, eps, scale, shift);
  if (act == Activation::none) {
    T* py = data_as<T>(y);
    return normalize<Activation::none, true, Store>(px, py, py, l, scale, shift);
  }
  T* pz = data_as<T>(z);
  if (y.defined()) {
    T* py = data_as<T>(y);
    if (act == Activation::relu)
      return normalize<Activation::relu, true, Store>(px, py, pz, l, scale, shift);
    return normalize<Activation::hardswish, true, Store>(px, py, pz, l, scale, shift);
  }
  if (act == Activation::relu)
    return normalize<Activation::relu, false, Store>(px, pz, pz, l, scale, shift);
  normalize<Activation::hardswish, false, Store>(px, pz, pz, l, scale, shift);
}

}  // namespace
}  // namespace dpar::cpu
