// CPU batch normalisation (nhwc or nchw, matching the activation): the forward and the backward
// from the output on dpar's loops (bn_loops.h), the backward from the input on oneDNN, and the
// running-statistics update.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/avx512_bf16.h"
#include "tensor/cpu/bn_isa.h"
#include "tensor/cpu/bn_loops.h"
#include "tensor/cpu/float_types.h"
#include "tensor/cpu/isa.h"
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
  // bf16 data (amp::Autocast's activations) is normalised with f32 statistics and parameters.
  c.data = memory::desc({x.size(0), x.size(1), x.size(2), x.size(3)},
                        onednn::data_type(x.dtype(), "batch_norm"),
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
  key.add(x.is_contiguous(MemoryFormat::ChannelsLast)).add(static_cast<int64_t>(x.dtype()));
  key.add(static_cast<int64_t>(c.fl)).add(training);
  int32_t eps_bits;
  static_assert(sizeof(eps_bits) == sizeof(eps));
  std::memcpy(&eps_bits, &eps, sizeof(eps));
  key.add(eps_bits);
  return key;
}

// The forward primitive's descriptor, which oneDNN's backward takes as its hint (the forward
// itself runs on dpar's loops).
const dnnl::batch_normalization_forward::primitive_desc& forward_hint(const Tensor& x,
                                                                      const BnConfig& c,
                                                                      float eps) {
  using Pd = dnnl::batch_normalization_forward::primitive_desc;
  return onednn::cached<Pd>(bn_key(onednn::Kind::batch_norm_forward, x, c, eps, true), [&] {
    dnnl::batch_normalization_forward::desc desc(dnnl::prop_kind::forward_training, c.data, eps,
                                                 c.fl);
    return Pd(desc, onednn::default_attr(), onednn::engine());
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
            desc, onednn::default_attr(), onednn::engine(), forward_hint(x, c, eps));
        e.prim = dnnl::batch_normalization_backward(e.pd);
        return e;
      });
}

// The forward is dpar's (bn_loops.h) in both dtypes: the statistics in one pass over x, then
// y and, fused, act(y) in a second, on 8 or 16 lanes where the CPU has AVX2 or AVX-512
// (bn_isa.h). oneDNN 2.6's f32 forward (three passes: mean, variance, normalisation) followed
// by the activation's own pass took 20-40% longer at MobileNetV3's large layers and about twice
// as long at its small ones (batch 16, one thread, AVX2); its bf16 kernel is fast only for
// channel counts that are multiples of 16.
void batch_norm_act_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                Tensor& mean, Tensor& var, bool use_batch_stats, double eps,
                                Activation act, Tensor& y, Tensor& z) {
  require_same_float("batch_norm", x, y.defined() ? y : z, "the output");
  if (x.dtype() == DType::bf16) {
    if (cpu_has_avx512_bf16()) {
      return bf16_native::batch_norm_forward_bf16(x, weight, bias, mean, var, use_batch_stats, eps,
                                                  act, y, z);
    }
    if (cpu_isa() == Isa::avx512) {
      return avx512::batch_norm_forward_bf16(x, weight, bias, mean, var, use_batch_stats, eps, act,
                                             y, z);
    }
    return batch_norm_forward_typed<BF16>(x, weight, bias, mean, var, use_batch_stats, eps, act, y,
                                          z);
  }
  switch (cpu_isa()) {
    case Isa::avx512:
      return avx512::batch_norm_forward_f32(x, weight, bias, mean, var, use_batch_stats, eps, act,
                                            y, z);
    case Isa::avx2:
      return avx2::batch_norm_forward_f32(x, weight, bias, mean, var, use_batch_stats, eps, act, y,
                                          z);
    case Isa::baseline:
      break;
  }
  batch_norm_forward_typed<float>(x, weight, bias, mean, var, use_batch_stats, eps, act, y, z);
}

void batch_norm_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& mean,
                            Tensor& var, bool use_batch_stats, bool need_backward, double eps,
                            Tensor& y) {
  Tensor no_activation;
  batch_norm_act_forward_cpu(x, weight, bias, mean, var, use_batch_stats, eps, Activation::none, y,
                             no_activation);
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

// y, dz and dx in f32, or in bf16 (amp::Autocast's activations); the sums in f32 and double.
void batch_norm_backward_from_output_cpu(const Tensor& y, const Tensor& dz, const Tensor& weight,
                                         const Tensor& bias, const Tensor& var,
                                         bool use_batch_stats, double eps, Activation act,
                                         Tensor& dx, Tensor& dweight, Tensor& dbias) {
  require_same_float("batch_norm backward", y, dz, "the output gradient");
  require_same_float("batch_norm backward", y, dx, "the input gradient");
  if (y.dtype() == DType::bf16 && cpu_has_avx512_bf16()) {
    return bf16_native::batch_norm_backward_from_output_bf16(
        y, dz, weight, bias, var, use_batch_stats, eps, act, dx, dweight, dbias);
  }
  if (y.dtype() == DType::bf16 && cpu_isa() == Isa::avx512) {
    return avx512::batch_norm_backward_from_output_bf16(y, dz, weight, bias, var, use_batch_stats,
                                                        eps, act, dx, dweight, dbias);
  }
  if (y.dtype() == DType::f32 && cpu_isa() != Isa::baseline) {
    if (cpu_isa() == Isa::avx512) {
      return avx512::batch_norm_backward_from_output_f32(y, dz, weight, bias, var, use_batch_stats,
                                                         eps, act, dx, dweight, dbias);
    }
    return avx2::batch_norm_backward_from_output_f32(y, dz, weight, bias, var, use_batch_stats, eps,
                                                     act, dx, dweight, dbias);
  }
  visit_float_dtype(y.dtype(), "batch_norm backward", [&](auto tag) {
    bn_backward_from_output_typed<typename decltype(tag)::type>(
        y, dz, weight, bias, var, use_batch_stats, eps, act, dx, dweight, dbias);
  });
}

void batch_norm_act_backward_cpu(const Tensor& x, const Tensor& dz, const Tensor& weight,
                                 const Tensor& bias, const Tensor& mean, const Tensor& var,
                                 bool use_batch_stats, double eps, Activation act, Tensor& dx,
                                 Tensor& dweight, Tensor& dbias) {
  DPAR_CHECK(x.dtype() == DType::f32, "batch_norm_act backward: input has dtype ", x.dtype(),
             "; the backward from the input with the activation fused supports f32");
  require_same_float("batch_norm_act backward", x, dz, "the output gradient");
  require_same_float("batch_norm_act backward", x, dx, "the input gradient");
  switch (cpu_isa()) {
    case Isa::avx512:
      return avx512::batch_norm_act_backward_f32(x, dz, weight, bias, mean, var, use_batch_stats,
                                                 eps, act, dx, dweight, dbias);
    case Isa::avx2:
      return avx2::batch_norm_act_backward_f32(x, dz, weight, bias, mean, var, use_batch_stats, eps,
                                               act, dx, dweight, dbias);
    case Isa::baseline:
      break;
  }
  bn_act_backward_from_input_typed<float>(x, dz, weight, bias, mean, var, use_batch_stats, eps, act,
                                          dx, dweight, dbias);
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
  kernels::batch_norm_act_forward.set(DeviceType::CPU, &batch_norm_act_forward_cpu);
  kernels::batch_norm_backward.set(DeviceType::CPU, &batch_norm_backward_cpu);
  kernels::batch_norm_backward_from_output.set(DeviceType::CPU,
                                               &batch_norm_backward_from_output_cpu);
  kernels::batch_norm_act_backward.set(DeviceType::CPU, &batch_norm_act_backward_cpu);
  kernels::batch_norm_update_stats.set(DeviceType::CPU, &batch_norm_update_stats_cpu);
}

}  // namespace dpar::cpu
