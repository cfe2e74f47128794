// CPU batch normalisation on oneDNN (nhwc or nchw, matching the activation), plus the
// running-statistics update.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/onednn_context.h"
#include "tensor/nn_kernels.h"

namespace dpar::cpu {
namespace {

using dnnl::memory;
using flags = dnnl::normalization_flags;
constexpr auto f32 = memory::data_type::f32;

struct BnConfig {
  memory::desc data, stat;
  flags fl = flags::none;
};

BnConfig make_config(const Tensor& x, bool has_weight, bool has_bias, bool use_batch_stats) {
  BnConfig c;
  const bool nhwc = x.is_contiguous(MemoryFormat::ChannelsLast);
  c.data = memory::desc({x.size(0), x.size(1), x.size(2), x.size(3)}, f32,
                        nhwc ? memory::format_tag::nhwc : memory::format_tag::nchw);
  c.stat = memory::desc({x.size(1)}, f32, memory::format_tag::x);
  if (has_weight) c.fl = c.fl | flags::use_scale;
  if (has_bias) c.fl = c.fl | flags::use_shift;
  if (!use_batch_stats) c.fl = c.fl | flags::use_global_stats;
  return c;
}

onednn::Key bn_key(onednn::Kind kind, const Tensor& x, const BnConfig& c, float eps,
                   bool training) {
  onednn::Key key(kind);
  key.add(x.size(0)).add(x.size(1)).add(x.size(2)).add(x.size(3));
  key.add(x.is_contiguous(MemoryFormat::ChannelsLast));
  key.add(static_cast<int64_t>(c.fl)).add(training);
  int32_t eps_bits;
  static_assert(sizeof(eps_bits) == sizeof(eps));
  std::memcpy(&eps_bits, &eps, sizeof(eps));
  key.add(eps_bits);
  return key;
}

struct BnForward {
  dnnl::batch_normalization_forward::primitive_desc pd;
  dnnl::batch_normalization_forward prim;
};

const BnForward& forward_entry(const Tensor& x, const BnConfig& c, float eps, bool training) {
  return onednn::cached<BnForward>(
      bn_key(onednn::Kind::batch_norm_forward, x, c, eps, training), [&] {
        const auto prop =
            training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
        dnnl::batch_normalization_forward::desc desc(prop, c.data, eps, c.fl);
        BnForward e;
        e.pd = dnnl::batch_normalization_forward::primitive_desc(desc, onednn::default_attr(),
                                                                 onednn::engine());
        e.prim = dnnl::batch_normalization_forward(e.pd);
        return e;
      });
}

struct BnBackward {
  dnnl::batch_normalization_backward::primitive_desc pd;
  dnnl::batch_normalization_backward prim;
};

const BnBackward& backward_entry(const Tensor& x, const BnConfig& c, float eps) {
  return onednn::cached<BnBackward>(
      bn_key(onednn::Kind::batch_norm_backward, x, c, eps, true), [&] {
        // prop_kind::backward also yields the scale/shift gradients; without either flag
        // there are none and backward_data is the matching kind.
        const bool params = (c.fl & (flags::use_scale | flags::use_shift)) != flags::none;
        dnnl::batch_normalization_backward::desc desc(
            params ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data, c.data, c.data,
            eps, c.fl);
        BnBackward e;
        e.pd = dnnl::batch_normalization_backward::primitive_desc(
            desc, onednn::default_attr(), onednn::engine(), forward_entry(x, c, eps, true).pd);
        e.prim = dnnl::batch_normalization_backward(e.pd);
        return e;
      });
}

void batch_norm_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& mean,
                            Tensor& var, bool use_batch_stats, bool need_backward, double eps,
                            Tensor& y) {
  const BnConfig c = make_config(x, weight.defined(), bias.defined(), use_batch_stats);
  // Batch statistics are only returned by the training variant.
  const bool training = need_backward || use_batch_stats;
  const float feps = static_cast<float>(eps);
  const BnForward& e = forward_entry(x, c, feps, training);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, onednn::wrap(c.data, x)},
                                       {DNNL_ARG_DST, onednn::wrap(c.data, y)},
                                       {DNNL_ARG_MEAN, onednn::wrap(c.stat, mean)},
                                       {DNNL_ARG_VARIANCE, onednn::wrap(c.stat, var)}};
  if (weight.defined()) args.emplace(DNNL_ARG_SCALE, onednn::wrap(c.stat, weight));
  if (bias.defined()) args.emplace(DNNL_ARG_SHIFT, onednn::wrap(c.stat, bias));
  onednn::execute(e.prim, e.pd.scratchpad_desc(), std::move(args));
}

void batch_norm_backward_cpu(const Tensor& x, const Tensor& dy, const Tensor& weight,
                             const Tensor& bias, const Tensor& mean, const Tensor& var,
                             bool use_batch_stats, double eps, Tensor& dx, Tensor& dweight,
                             Tensor& dbias) {
  const BnConfig c = make_config(x, weight.defined(), bias.defined(), use_batch_stats);
  const BnBackward& e = backward_entry(x, c, static_cast<float>(eps));
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, onednn::wrap(c.data, x)},
                                       {DNNL_ARG_DIFF_DST, onednn::wrap(c.data, dy)},
                                       {DNNL_ARG_MEAN, onednn::wrap(c.stat, mean)},
                                       {DNNL_ARG_VARIANCE, onednn::wrap(c.stat, var)},
                                       {DNNL_ARG_DIFF_SRC, onednn::wrap(c.data, dx)}};
  if (weight.defined()) {
    args.emplace(DNNL_ARG_SCALE, onednn::wrap(c.stat, weight));
    args.emplace(DNNL_ARG_DIFF_SCALE, onednn::wrap(c.stat, dweight));
  }
  if (bias.defined()) {
    // oneDNN 2.6 requires the shift among the backward arguments although dx does not use it.
    args.emplace(DNNL_ARG_SHIFT, onednn::wrap(c.stat, bias));
    args.emplace(DNNL_ARG_DIFF_SHIFT, onednn::wrap(c.stat, dbias));
  }
  onednn::execute(e.prim, e.pd.scratchpad_desc(), std::move(args));
}

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

struct BnBackwardArgs {
  const float* y;
  const float* dz;
  float* dx;
  bool nhwc;
  int64_t N, C, HW;
  std::vector<float> shift, inv_scale, gain;  // x_hat = (y - shift) * inv_scale; dx = gain * ..
};

// Per-channel sums of dy and dy * x_hat over a contiguous (NCHW) or channels-last y. Each
// thread sums a fixed static share into its own row and the rows are added in thread order,
// so the result is the same on every run.
template <Activation Act>
void sum_dy_and_dy_xhat(const BnBackwardArgs& a, std::vector<double>& sum_dy,
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
          const float* __restrict yr = a.y + r * C;
          const float* __restrict dr = a.dz + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const float dy = act_grad<Act>(dr[c], yr[c]);
            f1[c] += dy;
            f2[c] += dy * ((yr[c] - shift[c]) * inv_scale[c]);
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
          const float* __restrict yp = a.y + (n * C + c) * HW;
          const float* __restrict dp = a.dz + (n * C + c) * HW;
          float pa = 0, pb = 0;  // one plane in float, vectorised; planes added in double
#pragma omp simd reduction(+ : pa, pb)
          for (int64_t p = 0; p < HW; ++p) {
            const float dy = act_grad<Act>(dp[p], yp[p]);
            pa += dy;
            pb += dy * ((yp[p] - shift[c]) * inv_scale[c]);
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
template <Activation Act>
void write_dx(const BnBackwardArgs& a, const std::vector<float>& mean_dy,
              const std::vector<float>& mean_dy_xhat) {
  const int64_t C = a.C, HW = a.HW, N = a.N;
  const float* __restrict shift = a.shift.data();
  const float* __restrict inv_scale = a.inv_scale.data();
  const float* __restrict gain = a.gain.data();
  const float* __restrict m1 = mean_dy.data();
  const float* __restrict m2 = mean_dy_xhat.data();
  const float* __restrict y = a.y;
  const float* __restrict dz = a.dz;
  float* __restrict dx = a.dx;
  if (a.nhwc) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * HW; ++r) {
      // Row pointers local to the loop body: the vectoriser cannot see through the shared
      // variables OpenMP passes to the outlined function.
      const float* __restrict yr = y + r * C;
      const float* __restrict dr = dz + r * C;
      float* __restrict xr = dx + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xh = (yr[c] - shift[c]) * inv_scale[c];
        xr[c] = gain[c] * (act_grad<Act>(dr[c], yr[c]) - m1[c] - xh * m2[c]);
      }
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < N * C; ++plane) {
      const int64_t c = plane % C;
      const int64_t o = plane * HW;
      const float sh = shift[c], is = inv_scale[c], g = gain[c], a1 = m1[c], a2 = m2[c];
      const float* __restrict yp = y + o;
      const float* __restrict dp = dz + o;
      float* __restrict xp = dx + o;
#pragma omp simd
      for (int64_t p = 0; p < HW; ++p) {
        const float xh = (yp[p] - sh) * is;
        xp[p] = g * (act_grad<Act>(dp[p], yp[p]) - a1 - xh * a2);
      }
    }
  }
}

template <Activation Act>
void bn_backward_from_output(const BnBackwardArgs& a, bool use_batch_stats, Tensor& dweight,
                             Tensor& dbias) {
  const size_t uC = static_cast<size_t>(a.C);
  std::vector<double> sum_dy, sum_dy_xhat;
  sum_dy_and_dy_xhat<Act>(a, sum_dy, sum_dy_xhat);
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
  write_dx<Act>(a, mean_dy, mean_dy_xhat);
}

void batch_norm_backward_from_output_cpu(const Tensor& y, const Tensor& dz, const Tensor& weight,
                                         const Tensor& bias, const Tensor& var,
                                         bool use_batch_stats, double eps, Activation act,
                                         Tensor& dx, Tensor& dweight, Tensor& dbias) {
  BnBackwardArgs a{y.data<float>(),
                   dz.data<float>(),
                   dx.data<float>(),
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

void batch_norm_update_stats_cpu(Tensor& running_mean, Tensor& running_var,
                                 const Tensor& batch_mean, const Tensor& batch_var, double momentum,
                                 int64_t count) {
  float* rm = running_mean.data<float>();
  float* rv = running_var.data<float>();
  const int64_t sm = running_mean.stride(0), sv = running_var.stride(0);
  const float* bm = batch_mean.data<float>();
  const float* bv = batch_var.data<float>();
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  const int64_t C = running_mean.size(0);
  for (int64_t c = 0; c < C; ++c) {
    rm[c * sm] = static_cast<float>((1.0 - momentum) * rm[c * sm] + momentum * bm[c]);
    rv[c * sv] = static_cast<float>((1.0 - momentum) * rv[c * sv] + momentum * bv[c] * unbias);
  }
}

}  // namespace

void register_norm_kernels() {
  kernels::batch_norm_forward.set(DeviceType::CPU, &batch_norm_forward_cpu);
  kernels::batch_norm_backward.set(DeviceType::CPU, &batch_norm_backward_cpu);
  kernels::batch_norm_backward_from_output.set(DeviceType::CPU,
                                               &batch_norm_backward_from_output_cpu);
  kernels::batch_norm_update_stats.set(DeviceType::CPU, &batch_norm_update_stats_cpu);
}

}  // namespace dpar::cpu
