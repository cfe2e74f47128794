// CPU batch normalisation on oneDNN (nhwc or nchw, matching the activation), plus the
// running-statistics update.
#include <omp.h>

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

// Per-channel sums of dy and dy * x_hat over a contiguous (NCHW) or channels-last y, with
// x_hat = (y - shift) * inv_scale. Each thread sums a fixed static share into its own row and
// the rows are added in thread order, so the result is the same on every run.
void sum_dy_and_dy_xhat(const float* y, const float* dy, bool nhwc, int64_t N, int64_t C,
                        int64_t HW, const std::vector<float>& shift,
                        const std::vector<float>& inv_scale, std::vector<double>& sum_dy,
                        std::vector<double>& sum_dy_xhat) {
  const int threads = omp_get_max_threads();
  std::vector<double> part(static_cast<size_t>(2 * threads * C), 0.0);
  const size_t uC = static_cast<size_t>(C);
#pragma omp parallel num_threads(threads)
  {
    double* s1 = part.data() + static_cast<size_t>(2 * omp_get_thread_num()) * uC;
    double* s2 = s1 + uC;
    if (nhwc) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < N * HW; ++r) {
        const float* yr = y + r * C;
        const float* dr = dy + r * C;
        for (int64_t c = 0; c < C; ++c) {
          s1[c] += dr[c];
          s2[c] += static_cast<double>(dr[c] * ((yr[c] - shift[c]) * inv_scale[c]));
        }
      }
    } else {
#pragma omp for schedule(static)
      for (int64_t c = 0; c < C; ++c) {
        double a = 0, b = 0;
        for (int64_t n = 0; n < N; ++n) {
          const float* yp = y + (n * C + c) * HW;
          const float* dp = dy + (n * C + c) * HW;
          float pa = 0, pb = 0;  // one plane in float, vectorised; planes added in double
          for (int64_t p = 0; p < HW; ++p) {
            pa += dp[p];
            pb += dp[p] * ((yp[p] - shift[c]) * inv_scale[c]);
          }
          a += pa;
          b += pb;
        }
        s1[c] = a;
        s2[c] = b;
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

void batch_norm_backward_from_output_cpu(const Tensor& y, const Tensor& dy, const Tensor& weight,
                                         const Tensor& bias, const Tensor& mean, const Tensor& var,
                                         bool use_batch_stats, double eps, Tensor& dx,
                                         Tensor& dweight, Tensor& dbias) {
  (void)mean;  // x_hat comes from y; the mean only matters through it
  const int64_t N = y.size(0), C = y.size(1), HW = y.size(2) * y.size(3);
  const bool nhwc = y.is_contiguous(MemoryFormat::ChannelsLast) && !y.is_contiguous();
  const size_t uC = static_cast<size_t>(C);
  std::vector<float> shift(uC, 0.f), inv_scale(uC, 1.f), gain(uC);
  const float* w = weight.defined() ? weight.data<float>() : nullptr;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  const float* v = var.data<float>();
  for (size_t c = 0; c < uC; ++c) {
    const float scale = w ? w[c] : 1.f;
    if (b) shift[c] = b[c];
    inv_scale[c] = 1.f / scale;
    gain[c] = scale / std::sqrt(v[c] + static_cast<float>(eps));  // dx = gain * (...)
  }
  std::vector<double> sum_dy, sum_dy_xhat;
  sum_dy_and_dy_xhat(y.data<float>(), dy.data<float>(), nhwc, N, C, HW, shift, inv_scale, sum_dy,
                     sum_dy_xhat);
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
    const double M = static_cast<double>(N * HW);
    for (size_t c = 0; c < uC; ++c) {
      mean_dy[c] = static_cast<float>(sum_dy[c] / M);
      mean_dy_xhat[c] = static_cast<float>(sum_dy_xhat[c] / M);
    }
  }
  const float* Y = y.data<float>();
  const float* DY = dy.data<float>();
  float* DX = dx.data<float>();
  if (nhwc) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * HW; ++r) {
      const int64_t o = r * C;
      for (int64_t c = 0; c < C; ++c) {
        const float xh = (Y[o + c] - shift[c]) * inv_scale[c];
        DX[o + c] = gain[c] * (DY[o + c] - mean_dy[c] - xh * mean_dy_xhat[c]);
      }
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < N * C; ++plane) {
      const size_t c = static_cast<size_t>(plane % C);
      const int64_t o = plane * HW;
      for (int64_t p = 0; p < HW; ++p) {
        const float xh = (Y[o + p] - shift[c]) * inv_scale[c];
        DX[o + p] = gain[c] * (DY[o + p] - mean_dy[c] - xh * mean_dy_xhat[c]);
      }
    }
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
