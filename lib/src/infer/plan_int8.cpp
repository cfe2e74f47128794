// int8 convolutions and inner products of QDQ models: u8/s8 source, s8 weights (reordered
// once, with the compensation oneDNN adds for s8 sources), s32 accumulation, per-channel
// output scales src_scale * w_scale[o], the fused post-ops in f32, and an f32 destination or,
// when the next layers read it in int8 (Fused::requant), a u8/s8 one (f32 values on its grid
// where they compute in f32 on it: Fused::requant_f32).
#include "infer/plan.h"
#include "infer/plan_util.h"
#include "tensor/cpu/onednn_context.h"

namespace dpar::infer::detail {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

namespace {

memory::desc plain_md_of(const Shape& dims, dt type) {
  return memory::desc(dims, type, contiguous_strides(dims));
}

std::string type_name(dt type) { return type == dt::u8 ? "u8" : type == dt::s8 ? "s8" : "f32"; }

dnnl::primitive_attr int8_attr(const dnnl::primitive_attr& base, const Op& op) {
  dnnl::primitive_attr attr = base;
  std::vector<float> scales = op.int8.w_scales;
  for (float& s : scales) s *= op.int8.src_scale;
  // Mask bit 1: one scale per output channel (dst dimension 1).
  attr.set_output_scales(scales.size() == 1 ? 0 : 1 << 1, scales);
  return attr;
}

}  // namespace

void Plan::build_conv_int8(const Fused& f) {
  const Op& op = program_.ops[f.op_index];
  const Shape& x = values_[static_cast<size_t>(op.src)].dims;
  const Shape& y = values_[static_cast<size_t>(f.dst)].dims;
  const Shape& w = op.weight.shape();
  const dt src_type = op.int8.src_unsigned ? dt::u8 : dt::s8;
  const dt dst_type = f.dst_type();
  const bool grouped = op.groups > 1;
  const memory::dims wdims =
      grouped ? memory::dims{op.groups, w[0] / op.groups, w[1], w[2], w[3]} : memory::dims(w);
  const memory::desc w_plain(wdims, dt::s8, grouped ? tag::goihw : tag::oihw);
  const memory::desc w_any(wdims, dt::s8, tag::any);
  const memory::desc bias_md({w[0]}, kF32, tag::x);
  const auto& pads = conv_pads_[f.op_index];
  const dnnl::primitive_attr attr = int8_attr(post_op_attr(f), op);
  auto make = [&](const memory::desc& src) {
    const memory::desc dst(y, dst_type, tag::any);
    const memory::dims strides{op.stride[0], op.stride[1]};
    const memory::dims dilates{op.dilation[0] - 1, op.dilation[1] - 1};
    const memory::dims pad_l{pads[0], pads[1]}, pad_r{pads[2], pads[3]};
    dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                         dnnl::algorithm::convolution_direct, src, w_any, bias_md,
                                         dst, strides, dilates, pad_l, pad_r);
    return dnnl::convolution_forward::primitive_desc(desc, attr, engine());
  };
  auto pd = make(memory::desc(x, src_type, tag::any));
  int src = op.src;
  const memory::desc have = values_[static_cast<size_t>(src)].md;
  if (pd.src_desc() != have) {
    // Already integers of the right type (requantised by the producer) in another layout: a
    // fast kernel on that layout beats a reorder, as for f32.
    if (have.data_type() == src_type) {
      try {
        auto exact = make(have);
        if (!is_reference(exact.impl_info_str())) pd = exact;
      } catch (const dnnl::error&) {
        // No implementation for this layout with these attributes; reorder instead.
      }
    }
    src = to_layout(src, pd.src_desc(), op.int8.src_scale);
  }
  finish_int8_step(f, src, w_plain, bias_md, pd, dnnl::convolution_forward(pd));
}

void Plan::finish_int8_step(const Fused& f, int src, const memory::desc& w_plain,
                            const memory::desc& bias_md, const dnnl::primitive_desc_base& pd,
                            dnnl::primitive prim, bool as_1x1_conv) {
  const Op& op = program_.ops[f.op_index];
  // "conv int8 u8->s8", "inner_product int8 s8->f32 as 1x1 conv weights halved", ...
  const std::string what =
      std::string(op.kind == OpKind::Conv ? "conv" : "inner_product") + " int8 " +
      type_name(pd.src_desc().data_type()) + "->" + type_name(pd.dst_desc().data_type()) +
      (as_1x1_conv ? " as 1x1 conv" : "") + (op.int8.halved ? " weights halved" : "");
  Step s;
  s.value_args = {{DNNL_ARG_SRC, src, std::nullopt}, {DNNL_ARG_DST, f.dst, std::nullopt}};
  memory::desc dst_md = pd.dst_desc();
  if (as_1x1_conv) {
    // The 2-D values keep their plain layout; the convolution sees the same bytes as 4-D.
    s.value_args[0].md = pd.src_desc();
    s.value_args[1].md = pd.dst_desc();
    dst_md = plain_md_of(values_[static_cast<size_t>(f.dst)].dims, dst_md.data_type());
  }
  s.reads = {src};
  s.dst = f.dst;
  s.fixed_args[DNNL_ARG_WEIGHTS] = weights_.get(f.op_index, op.weight, w_plain, pd.weights_desc());
  s.fixed_args[DNNL_ARG_BIAS] = memory(bias_md, engine(), op.bias.raw_data());
  s.category = op.kind == OpKind::Conv
                   ? conv_category(op, values_[static_cast<size_t>(op.src)].dims) + " int8"
                   : "inner_product int8";
  add_sum_operand(s, f, dst_md);
  if (f.dst_type() != dt::f32) values_[static_cast<size_t>(f.dst)].qscale = f.requant;
  finish_step(std::move(s), pd, std::move(prim), what, f.nodes);
}

void Plan::build_gemm_int8(const Fused& f) {
  const Op& op = program_.ops[f.op_index];
  const dt src_type = op.int8.src_unsigned ? dt::u8 : dt::s8;
  const dt dst_type = f.dst_type();
  const Shape x = values_[static_cast<size_t>(op.src)].dims;  // to_layout may grow values_
  const int src = to_layout(op.src, plain_md_of(x, src_type), op.int8.src_scale);
  const Shape& y = values_[static_cast<size_t>(f.dst)].dims;
  const memory::dims wdims = op.weight.shape();
  const memory::desc w_any(wdims, dt::s8, tag::any), w_plain(wdims, dt::s8, tag::oi);
  const memory::desc bias_md({wdims[0]}, kF32, tag::x);
  const dnnl::primitive_attr attr = int8_attr(post_op_attr(f), op);
  // Without VNNI, oneDNN's int8 inner product (gemm_s8s8s32) sums pairs of u8 x s8 products in
  // 16 bits, which saturate (errors of the order of the result itself on full-range data), and
  // at batch 1 it took 0.24 + 0.39 ms for MobileNetV3's classifier (ONEDNN_VERBOSE, in the
  // model), more than the f32 layers. Its 1x1 convolution kernels halve the weights of s8
  // sources to keep those sums in range (lowering halves u8 sources' weights: lower.cpp's
  // make_int8) and, in a loop with the caches flushed between calls, ran the same products in
  // 0.05 + 0.07 ms against the inner product's 0.29 + 0.51. A row-major {N, K} matrix is an
  // {N, K, 1, 1} NHWC map, and {O, K} weights are {O, K, 1, 1} OIHW: the same bytes.
  if (!cpu::onednn::has_int8_dot_product()) {
    const memory::desc src4({x[0], x[1], 1, 1}, src_type, tag::nhwc);
    const memory::desc dst4({y[0], y[1], 1, 1}, dst_type, tag::nhwc);
    const memory::dims w4{wdims[0], wdims[1], 1, 1};
    try {
      dnnl::convolution_forward::desc desc(
          dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src4,
          memory::desc(w4, dt::s8, tag::any), bias_md, dst4, {1, 1}, {0, 0}, {0, 0});
      dnnl::convolution_forward::primitive_desc pd(desc, attr, engine());
      if (!is_reference(pd.impl_info_str())) {
        return finish_int8_step(f, src, memory::desc(w4, dt::s8, tag::oihw), bias_md, pd,
                                dnnl::convolution_forward(pd), true);
      }
    } catch (const dnnl::error&) {
      // No convolution kernel for these types and attributes: the inner product below (whose
      // s8-source sums may saturate; the plan line then lacks "as 1x1 conv").
    }
  }
  const memory::desc src_md = values_[static_cast<size_t>(src)].md;
  dnnl::inner_product_forward::desc desc(dnnl::prop_kind::forward_inference, src_md, w_any, bias_md,
                                         plain_md_of(y, dst_type));
  dnnl::inner_product_forward::primitive_desc pd(desc, attr, engine());
  finish_int8_step(f, src, w_plain, bias_md, pd, dnnl::inner_product_forward(pd));
}

}  // namespace dpar::infer::detail
