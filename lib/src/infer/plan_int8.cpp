// int8 convolutions and inner products of QDQ models: u8/s8 source, s8 weights (reordered
// once, with the compensation oneDNN adds for s8 sources), s32 accumulation, per-channel
// output scales src_scale * w_scale[o], the fused post-ops in f32, and an f32 destination or,
// when the next layers read it in int8 (Fused::requant), a u8/s8 one.
#include "infer/plan.h"
#include "infer/plan_util.h"

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
  const dt dst_type = f.requant > 0 ? (f.requant_unsigned ? dt::u8 : dt::s8) : dt::f32;
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
  finish_int8_step(f, src, w_plain, bias_md, pd, dnnl::convolution_forward(pd),
                   "conv int8 " + type_name(src_type) + "->" + type_name(dst_type));
}

void Plan::finish_int8_step(const Fused& f, int src, const memory::desc& w_plain,
                            const memory::desc& bias_md, const dnnl::primitive_desc_base& pd,
                            dnnl::primitive prim, const std::string& what) {
  const Op& op = program_.ops[f.op_index];
  Step s;
  s.value_args = {{DNNL_ARG_SRC, src, std::nullopt}, {DNNL_ARG_DST, f.dst, std::nullopt}};
  s.reads = {src};
  s.dst = f.dst;
  s.fixed_args[DNNL_ARG_WEIGHTS] = weights_.get(f.op_index, op.weight, w_plain, pd.weights_desc());
  s.fixed_args[DNNL_ARG_BIAS] = memory(bias_md, engine(), op.bias.raw_data());
  s.category = op.kind == OpKind::Conv
                   ? conv_category(op, values_[static_cast<size_t>(op.src)].dims) + " int8"
                   : "inner_product int8";
  add_sum_operand(s, f, pd.dst_desc());
  values_[static_cast<size_t>(f.dst)].qscale = f.requant;
  finish_step(std::move(s), pd, std::move(prim), what, f.nodes);
}

void Plan::build_gemm_int8(const Fused& f) {
  const Op& op = program_.ops[f.op_index];
  const dt src_type = op.int8.src_unsigned ? dt::u8 : dt::s8;
  const dt dst_type = f.requant > 0 ? (f.requant_unsigned ? dt::u8 : dt::s8) : dt::f32;
  const Shape& x = values_[static_cast<size_t>(op.src)].dims;
  const int src = to_layout(op.src, plain_md_of(x, src_type), op.int8.src_scale);
  const Shape& y = values_[static_cast<size_t>(f.dst)].dims;
  const memory::dims wdims = op.weight.shape();
  const memory::desc w_any(wdims, dt::s8, tag::any), w_plain(wdims, dt::s8, tag::oi);
  const memory::desc bias_md({wdims[0]}, kF32, tag::x);
  const memory::desc src_md = values_[static_cast<size_t>(src)].md;
  dnnl::inner_product_forward::desc desc(dnnl::prop_kind::forward_inference, src_md, w_any, bias_md,
                                         plain_md_of(y, dst_type));
  dnnl::inner_product_forward::primitive_desc pd(desc, int8_attr(post_op_attr(f), op), engine());
  finish_int8_step(f, src, w_plain, bias_md, pd, dnnl::inner_product_forward(pd),
                   "inner_product int8 " + type_name(src_type) + "->" + type_name(dst_type));
}

}  // namespace dpar::infer::detail
