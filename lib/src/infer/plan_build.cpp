// Plan construction, per op: fusion of activations / residual additions into the producing
// convolution or inner product, and creation of the oneDNN primitives (shapes: shapes.cpp).
#include <algorithm>

#include "infer/global_pool.h"
#include "infer/plan.h"
#include "infer/plan_util.h"

namespace dpar::infer::detail {

using dnnl::memory;
using tag = memory::format_tag;

std::string conv_category(const Op& op, const Shape& x) {
  const Shape& w = op.weight.shape();
  const std::string kernel = std::to_string(w[2]) + "x" + std::to_string(w[3]);
  if (op.groups > 1 && op.groups == x[1] && w[1] == 1) return "conv depthwise " + kernel;
  if (x[2] == 1 && x[3] == 1) return "conv " + kernel + " on 1x1 maps";
  return "conv " + kernel + (op.groups > 1 ? " grouped" : "");
}

void Plan::set_requant(Fused& f, const std::vector<int>& readers, bool integers, bool grid) const {
  const auto& ops = program_.ops;
  if (readers.empty() || f.dst == program_.output) return;
  const Op& first = ops[static_cast<size_t>(readers[0])];
  bool all_f32 = true;
  for (int r : readers) {
    const Op& c = ops[static_cast<size_t>(r)];
    if (!(c.int8.on || c.int8.f32) || c.src != f.dst || c.src2 == f.dst ||
        c.int8.src_scale != first.int8.src_scale ||
        c.int8.src_unsigned != first.int8.src_unsigned) {
      return;
    }
    all_f32 = all_f32 && c.int8.f32;
  }
  if (all_f32 ? !grid : !integers) return;
  f.requant = first.int8.src_scale;
  f.requant_unsigned = first.int8.src_unsigned;
  f.requant_f32 = all_f32;
}

std::vector<Plan::Fused> Plan::fuse() const {
  const auto& ops = program_.ops;
  std::vector<int> uses(values_.size(), 0), consumer(values_.size(), -1);
  std::vector<int> producer(values_.size(), -1);
  std::vector<std::vector<int>> readers(values_.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    for (int v : {ops[i].src, ops[i].src2}) {
      if (v < 0) continue;
      ++uses[static_cast<size_t>(v)];
      readers[static_cast<size_t>(v)].push_back(static_cast<int>(i));
      consumer[static_cast<size_t>(v)] = static_cast<int>(i);
    }
    producer[static_cast<size_t>(ops[i].dst)] = static_cast<int>(i);
  }
  ++uses[static_cast<size_t>(program_.output)];
  std::vector<bool> removed(ops.size(), false);
  std::vector<Fused> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (removed[i]) continue;
    Fused f{i, {}, ops[i].dst, ops[i].nodes};
    bool has_sum = false;
    if (ops[i].kind == OpKind::Conv || ops[i].kind == OpKind::Gemm) {
      for (int cur = f.dst; uses[static_cast<size_t>(cur)] == 1 && cur != program_.output;) {
        const size_t j = static_cast<size_t>(consumer[static_cast<size_t>(cur)]);
        const Op& c = ops[j];
        if (c.kind == OpKind::Eltwise) {
          for (const Eltwise& act : c.acts) f.post.push_back({false, act, -1});
        } else if (c.kind == OpKind::Binary && c.binary_alg == dnnl::algorithm::binary_add &&
                   !has_sum) {
          // dst = conv(x) + other, computed in place of `other`: it must already exist when
          // the convolution runs, and must not need broadcasting.
          const int other = c.src == cur ? c.src2 : c.src;
          const size_t o = static_cast<size_t>(other);
          const bool ready =
              other == program_.input || (producer[o] >= 0 && producer[o] < static_cast<int>(i));
          if (other == cur || program_.constants[o].defined() || !ready ||
              values_[o].dims != values_[static_cast<size_t>(cur)].dims) {
            break;
          }
          f.post.push_back({true, {dnnl::algorithm::eltwise_relu}, other});
          has_sum = true;
        } else {
          break;
        }
        removed[j] = true;
        f.nodes.insert(f.nodes.end(), c.nodes.begin(), c.nodes.end());
        cur = f.dst = c.dst;
      }
    }
    // Requantisation: when every reader of the result is an int8 Conv/Gemm (or one computed in
    // f32 on its dequantized input) quantizing it the same way, the producer writes those
    // integers directly, or f32 values on their grid where every reader computes in f32
    // (requant_f32). An int8 Conv/Gemm does both; a Binary (an SE block's Mul before an int8
    // projection) writes u8/s8 through the same post-op. Otherwise, and with a residual sum (the
    // operand added in place is f32), the readers quantize (Plan::to_layout, Plan::dequantized).
    const bool int8_layer = ops[i].int8.on;
    if ((int8_layer || ops[i].kind == OpKind::Binary) && !has_sum) {
      set_requant(f, readers[static_cast<size_t>(f.dst)], true, int8_layer);
    }
    out.push_back(std::move(f));
  }
  return out;
}

dnnl::primitive_attr Plan::post_op_attr(const Fused& f) const {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  for (const PostOp& p : f.post) {
    if (p.sum) {
      ops.append_sum(1.f);
    } else {
      ops.append_eltwise(1.f, p.act.alg, p.act.alpha, p.act.beta);
    }
  }
  // Post-ops see real values (output scales come first); the last one divides by the next
  // layer's scale, and the u8/s8 destination rounds to nearest even and saturates, as
  // QuantizeLinear does. For an f32 destination (requant_f32) the post-ops round to nearest
  // even, saturate and multiply back (the clip's own scale), as DequantizeLinear(QuantizeLinear(
  // x)) does. (A last eltwise_linear for that multiply was dropped by oneDNN 2.6's int8 AVX2
  // convolution: its results came out 1 / scale times too large.)
  if (f.requant > 0) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, 1.f / f.requant, 0.f);
  if (f.requant_f32) {
    ops.append_eltwise(1.f, dnnl::algorithm::eltwise_round, 0.f, 0.f);
    ops.append_eltwise(f.requant, dnnl::algorithm::eltwise_clip, f.requant_unsigned ? 0.f : -128.f,
                       f.requant_unsigned ? 255.f : 127.f);
  }
  attr.set_post_ops(ops);
  return attr;
}

int Plan::new_value(const Shape& dims, const memory::desc& md) {
  Value v;
  v.dims = dims;
  v.md = md;
  values_.push_back(std::move(v));
  return static_cast<int>(values_.size()) - 1;
}

int Plan::to_layout(int value, const memory::desc& md, float qscale) {
  const memory::desc from = values_[static_cast<size_t>(value)].md;
  const float have_scale = values_[static_cast<size_t>(value)].qscale;
  const bool to_int8 = md.data_type() != kF32;
  const float out_scale = to_int8 ? (have_scale > 0 ? have_scale : qscale) : 0.f;
  DPAR_CHECK(!to_int8 || out_scale > 0, program_.path, ": internal: quantizing without a scale");
  DPAR_CHECK(!to_int8 || qscale == 0 || have_scale == 0 || have_scale == qscale, program_.path,
             ": internal: a value quantized with scale ", have_scale, " is wanted at ", qscale);
  if (from == md) return value;
  // A value several consumers want in the same other layout is reordered once.
  for (const auto& [v, converted] : reordered_) {
    const Value& c = values_[static_cast<size_t>(converted)];
    if (v == value && c.md == md && c.qscale == out_scale) return converted;
  }
  const int out = new_value(values_[static_cast<size_t>(value)].dims, md);
  values_[static_cast<size_t>(out)].qscale = out_scale;
  reordered_.emplace_back(value, out);
  // f32 -> u8/s8 quantizes (x / scale, rounded to nearest even, saturated), u8/s8 -> f32
  // dequantizes; between equal types it is a layout change.
  dnnl::primitive_attr attr = user_scratchpad_attr();
  std::string what = "reorder";
  if (have_scale == 0 && to_int8) {
    attr.set_output_scales(0, {1.f / out_scale});
    what = "quantize";
  } else if (have_scale > 0 && !to_int8) {
    attr.set_output_scales(0, {have_scale});
    what = "dequantize";
  }
  dnnl::reorder::primitive_desc pd(engine(), from, engine(), md, attr);
  Step s;
  s.value_args = {{DNNL_ARG_FROM, value, std::nullopt}, {DNNL_ARG_TO, out, std::nullopt}};
  s.reads = {value};
  s.dst = out;
  finish_step(std::move(s), pd, dnnl::reorder(pd), what,
              {describe_layout(from) + " -> " + describe_layout(md)});
  return out;
}

// The integers the producer wrote for this op (requantisation) dequantized; an f32 value (a
// producer that cannot requantise, such as a residual sum) quantized first, so the op reads
// exactly the model's DequantizeLinear(QuantizeLinear(x)).
int Plan::dequantized(int value, const Op& op) {
  const Value& v = values_[static_cast<size_t>(value)];
  if (v.grid == op.int8.src_scale && v.grid_unsigned == op.int8.src_unsigned) return value;
  const Shape dims = v.dims;
  int integers = value;
  if (values_[static_cast<size_t>(value)].qscale == 0) {
    const auto type = op.int8.src_unsigned ? memory::data_type::u8 : memory::data_type::s8;
    integers = to_layout(value, memory::desc(dims, type, tag::nhwc), op.int8.src_scale);
  }
  return to_layout(integers, memory::desc(dims, kF32, tag::nhwc));
}

void Plan::add_sum_operand(Step& step, const Fused& f, const memory::desc& dst_md) {
  for (const PostOp& p : f.post) {
    if (!p.sum) continue;
    step.reads.push_back(p.operand);
    step.reuse = p.operand;
    step.reuse_required = true;
  }
  values_[static_cast<size_t>(f.dst)].md = dst_md;
}

void Plan::build_conv(const Fused& f) {
  const Op& op = program_.ops[f.op_index];
  if (op.int8.on) return build_conv_int8(f);
  const Shape x = values_[static_cast<size_t>(op.src)].dims;  // to_layout may grow values_
  const Shape y = values_[static_cast<size_t>(f.dst)].dims;
  const Shape& w = op.weight.shape();
  const bool grouped = op.groups > 1;
  const memory::dims wdims =
      grouped ? memory::dims{op.groups, w[0] / op.groups, w[1], w[2], w[3]} : memory::dims(w);
  const memory::desc w_plain(wdims, kF32, grouped ? tag::goihw : tag::oihw);
  const memory::desc w_any(wdims, kF32, tag::any);
  const auto& pads = conv_pads_[f.op_index];
  const dnnl::primitive_attr attr = post_op_attr(f);
  auto make = [&](const memory::desc& src, tag dst_layout) {
    const memory::desc dst(y, kF32, dst_layout);
    const memory::dims strides{op.stride[0], op.stride[1]};
    const memory::dims dilates{op.dilation[0] - 1, op.dilation[1] - 1};
    const memory::dims pad_l{pads[0], pads[1]}, pad_r{pads[2], pads[3]};
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto alg = dnnl::algorithm::convolution_direct;
    auto desc = op.bias.defined() ? dnnl::convolution_forward::desc(
                                        prop, alg, src, w_any, memory::desc({w[0]}, kF32, tag::x),
                                        dst, strides, dilates, pad_l, pad_r)
                                  : dnnl::convolution_forward::desc(prop, alg, src, w_any, dst,
                                                                    strides, dilates, pad_l, pad_r);
    return dnnl::convolution_forward::primitive_desc(desc, attr, engine());
  };
  // A fast kernel for this source and destination layout, if oneDNN has one.
  auto jit_kernel =
      [&](const memory::desc& src,
          tag dst_layout) -> std::optional<dnnl::convolution_forward::primitive_desc> {
    try {
      auto pd = make(src, dst_layout);
      if (!is_reference(pd.impl_info_str())) return pd;
    } catch (const dnnl::error&) {
      // No implementation for these layouts with these attributes.
    }
    return std::nullopt;
  };
  int src = op.src;
  const std::string category = conv_category(op, x);
  if (op.int8.f32) src = dequantized(src, op);
  const memory::desc have = values_[static_cast<size_t>(src)].md;
  const memory::desc src_any(x, kF32, tag::any);
  // Activations in the CPU's blocked layout when a jit kernel takes it (blocked_activation_tag
  // says why); the source stays as the producer wrote it if that is the blocked layout, else
  // oneDNN picks it (the network's NCHW input for the first convolution). Otherwise oneDNN
  // picks both layouts.
  tag dst_layout = blocked_activation_tag();
  std::optional<dnnl::convolution_forward::primitive_desc> pd;
  // A depthwise layer run in f32 for want of VNNI (lower.cpp, make_int8) sits between int8
  // layers, whose values are NHWC (oneDNN's int8 layout): it keeps NHWC when a jit kernel takes
  // it, and needs no reorder on either side.
  if (op.int8.f32 && have == memory::desc(x, kF32, tag::nhwc)) {
    pd = jit_kernel(have, tag::nhwc);
    if (pd) dst_layout = tag::nhwc;
  }
  if (!pd && dst_layout != tag::undef) {
    const memory::desc blocked(x, kF32, dst_layout);
    pd = jit_kernel(have == blocked ? blocked : src_any, dst_layout);
  }
  if (!pd) {
    dst_layout = tag::any;
    pd = make(src_any, dst_layout);
  }
  // If oneDNN wants another source layout than the producer wrote, prefer a non-reference
  // kernel on the existing layout over an extra reorder.
  if (pd->src_desc() != have) {
    if (auto exact = jit_kernel(have, dst_layout)) pd = std::move(exact);
    src = to_layout(src, pd->src_desc());
  }
  Step s;
  s.value_args = {{DNNL_ARG_SRC, src, std::nullopt}, {DNNL_ARG_DST, f.dst, std::nullopt}};
  s.reads = {src};
  s.dst = f.dst;
  s.category = category;
  s.fixed_args[DNNL_ARG_WEIGHTS] = weights_.get(f.op_index, op.weight, w_plain, pd->weights_desc());
  if (op.bias.defined()) {
    s.fixed_args[DNNL_ARG_BIAS] =
        memory(memory::desc({w[0]}, kF32, tag::x), engine(), op.bias.raw_data());
  }
  add_sum_operand(s, f, pd->dst_desc());
  finish_step(std::move(s), *pd, dnnl::convolution_forward(*pd), "conv", f.nodes);
}

void Plan::build_gemm(const Fused& f) {
  const Op& op = program_.ops[f.op_index];
  if (op.int8.on) return build_gemm_int8(f);
  const int src = to_layout(op.src, plain_md(values_[static_cast<size_t>(op.src)].dims));
  const Shape& y = values_[static_cast<size_t>(f.dst)].dims;
  const memory::dims wdims = op.weight.shape();
  const memory::desc src_md = values_[static_cast<size_t>(src)].md;
  const memory::desc w_any(wdims, kF32, tag::any), dst_md = plain_md(y);
  const auto prop = dnnl::prop_kind::forward_inference;
  auto desc = op.bias.defined()
                  ? dnnl::inner_product_forward::desc(
                        prop, src_md, w_any, memory::desc({wdims[0]}, kF32, tag::x), dst_md)
                  : dnnl::inner_product_forward::desc(prop, src_md, w_any, dst_md);
  dnnl::inner_product_forward::primitive_desc pd(desc, post_op_attr(f), engine());
  Step s;
  s.value_args = {{DNNL_ARG_SRC, src, std::nullopt}, {DNNL_ARG_DST, f.dst, std::nullopt}};
  s.reads = {src};
  s.dst = f.dst;
  s.fixed_args[DNNL_ARG_WEIGHTS] =
      weights_.get(f.op_index, op.weight, memory::desc(wdims, kF32, tag::oi), pd.weights_desc());
  if (op.bias.defined()) {
    s.fixed_args[DNNL_ARG_BIAS] =
        memory(memory::desc({wdims[0]}, kF32, tag::x), engine(), op.bias.raw_data());
  }
  add_sum_operand(s, f, pd.dst_desc());
  finish_step(std::move(s), pd, dnnl::inner_product_forward(pd), "inner_product", f.nodes);
}

void Plan::build_eltwise(const Op& op) {
  int src = op.src;
  for (size_t k = 0; k < op.acts.size(); ++k) {
    const Value& v = values_[static_cast<size_t>(src)];
    const Shape dims = v.dims;
    const memory::desc md = v.md;
    const int dst = k + 1 == op.acts.size() ? op.dst : new_value(dims, md);
    values_[static_cast<size_t>(dst)].md = md;
    const Eltwise& a = op.acts[k];
    dnnl::eltwise_forward::primitive_desc pd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, a.alg, md, a.alpha, a.beta),
        user_scratchpad_attr(), engine());
    Step s;
    s.value_args = {{DNNL_ARG_SRC, src, std::nullopt}, {DNNL_ARG_DST, dst, std::nullopt}};
    s.reads = {src};
    s.dst = dst;
    s.reuse = src;
    finish_step(std::move(s), pd, dnnl::eltwise_forward(pd), "eltwise", op.nodes);
    src = dst;
  }
}

void Plan::build_binary(const Fused& f) {
  const Op& op = program_.ops[f.op_index];
  int a = op.src, b = op.src2;
  const Shape& y = values_[static_cast<size_t>(op.dst)].dims;
  if (values_[static_cast<size_t>(a)].dims != y) std::swap(a, b);  // Add and Mul commute
  const Value& va = values_[static_cast<size_t>(a)];
  const Value& vb = values_[static_cast<size_t>(b)];
  // oneDNN broadcasts between equal ranks; a lower-rank operand gets leading 1s, which is a
  // view only for plain layouts (constants always are).
  std::optional<memory::desc> b_view;
  if (vb.dims.size() < y.size()) {
    DPAR_CHECK(is_plain(vb.md), program_.path, ": ", op.nodes[0], ": cannot broadcast ", vb.dims,
               " against ", y, " in layout ", describe_layout(vb.md));
    Shape padded(y.size() - vb.dims.size(), 1);
    padded.insert(padded.end(), vb.dims.begin(), vb.dims.end());
    b_view = plain_md(padded);
  }
  const memory::desc md_a = va.md;
  // Requantised (an SE block's Mul before an int8 projection): u8/s8 in a's layout.
  dnnl_memory_desc_t dst = md_a.data;
  dst.data_type = static_cast<dnnl_data_type_t>(f.dst_type());
  const memory::desc dst_md(dst);
  dnnl::binary::primitive_desc pd(
      dnnl::binary::desc(op.binary_alg, md_a, b_view ? *b_view : vb.md, dst_md), post_op_attr(f),
      engine());
  values_[static_cast<size_t>(op.dst)].md = dst_md;
  if (f.dst_type() != kF32) values_[static_cast<size_t>(op.dst)].qscale = f.requant;
  Step s;
  s.value_args = {{DNNL_ARG_SRC_0, a, std::nullopt},
                  {DNNL_ARG_SRC_1, b, b_view},
                  {DNNL_ARG_DST, op.dst, std::nullopt}};
  s.reads = {a, b};
  s.dst = op.dst;
  s.reuse = a;
  finish_step(std::move(s), pd, dnnl::binary(pd), "binary", op.nodes);
}

void Plan::build_pool(const Op& op) {
  const Value& v = values_[static_cast<size_t>(op.src)];
  const Shape x = v.dims;
  const memory::desc src_md = v.md;
  if (const auto layout = global_pool_layout(src_md)) {
    values_[static_cast<size_t>(op.dst)].md = global_pool_output_md(src_md);
    Step s;
    s.value_args = {{DNNL_ARG_SRC, op.src, std::nullopt}, {DNNL_ARG_DST, op.dst, std::nullopt}};
    s.reads = {op.src};
    s.dst = op.dst;
    s.kernel = [x, layout = *layout](const std::unordered_map<int, memory>& args) {
      global_average_pool(static_cast<const float*>(args.at(DNNL_ARG_SRC).get_data_handle()),
                          static_cast<float*>(args.at(DNNL_ARG_DST).get_data_handle()), x, layout);
    };
    finish_step(std::move(s), "dpar:global_average", memory::desc(), "pooling", op.nodes);
    return;
  }
  dnnl::pooling_v2_forward::primitive_desc pd(
      dnnl::pooling_v2_forward::desc(dnnl::prop_kind::forward_inference,
                                     dnnl::algorithm::pooling_avg_exclude_padding, src_md,
                                     memory::desc({x[0], x[1], 1, 1}, kF32, tag::any), {1, 1},
                                     {x[2], x[3]}, {0, 0}, {0, 0}, {0, 0}),
      user_scratchpad_attr(), engine());
  values_[static_cast<size_t>(op.dst)].md = pd.dst_desc();
  Step s;
  s.value_args = {{DNNL_ARG_SRC, op.src, std::nullopt}, {DNNL_ARG_DST, op.dst, std::nullopt}};
  s.reads = {op.src};
  s.dst = op.dst;
  finish_step(std::move(s), pd, dnnl::pooling_v2_forward(pd), "pooling", op.nodes);
}

void Plan::build_flatten(const Op& op) {
  // A plain layout flattens in place; anything else is first reordered to plain.
  const int src = to_layout(op.src, plain_md(values_[static_cast<size_t>(op.src)].dims));
  const Shape& y = values_[static_cast<size_t>(op.dst)].dims;
  values_[static_cast<size_t>(op.dst)].md = plain_md(y);
  Step s;
  s.reads = {src};
  s.dst = op.dst;
  s.reuse = src;
  s.reuse_required = true;
  s.view = true;
  s.text = "view " + shape_str(y) + " <- " + op.nodes[0];
  steps_.push_back(std::move(s));
}

void Plan::build_softmax(const Op& op) {
  const Shape& x = values_[static_cast<size_t>(op.src)].dims;
  const int64_t r = static_cast<int64_t>(x.size());
  int src = op.src;
  memory::desc md = values_[static_cast<size_t>(src)].md;
  int axis = static_cast<int>(op.axis < 0 ? op.axis + r : op.axis);
  std::optional<memory::desc> view;
  if (op.softmax_coerce_2d) {
    // Before opset 13, Softmax normalises over all dimensions from axis on, as one.
    src = to_layout(src, plain_md(x));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < r; ++d) (d < axis ? outer : inner) *= x[static_cast<size_t>(d)];
    view = md = plain_md({outer, inner});
    axis = 1;
  }
  dnnl::softmax_forward::primitive_desc pd(
      dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md, axis),
      user_scratchpad_attr(), engine());
  values_[static_cast<size_t>(op.dst)].md = values_[static_cast<size_t>(src)].md;
  Step s;
  s.value_args = {{DNNL_ARG_SRC, src, view}, {DNNL_ARG_DST, op.dst, view}};
  s.reads = {src};
  s.dst = op.dst;
  s.reuse = src;
  finish_step(std::move(s), pd, dnnl::softmax_forward(pd), "softmax", op.nodes);
}

void Plan::finish_step(Step step, const dnnl::primitive_desc_base& pd, dnnl::primitive prim,
                       const std::string& what, const std::vector<std::string>& nodes) {
  step.prim = std::move(prim);
  finish_step(std::move(step), pd.impl_info_str(), pd.scratchpad_desc(), what, nodes);
}

void Plan::finish_step(Step step, const std::string& impl, const memory::desc& scratchpad_md,
                       const std::string& what, const std::vector<std::string>& nodes) {
  if (step.category.empty()) step.category = what;
  // Convolutions, pooling, elementwise ops and reorders of NCHW-shaped values compute each
  // image from that image alone; inner products and softmax are left out (their rows need
  // not be images).
  static const char* const per_sample_kinds[] = {"conv",    "reorder", "quantize", "dequantize",
                                                 "eltwise", "binary",  "pooling"};
  step.per_sample = values_[static_cast<size_t>(step.dst)].dims.size() == 4 &&
                    std::any_of(std::begin(per_sample_kinds), std::end(per_sample_kinds),
                                [&](const char* k) { return what.rfind(k, 0) == 0; });
  step.scratchpad_md = scratchpad_md;
  step.one_thread = building_one_thread_;
  scratchpad_bytes_ = std::max(scratchpad_bytes_, step.scratchpad_md.get_size());
  std::string text = what + " " + impl + " " +
                     shape_str(values_[static_cast<size_t>(step.dst)].dims) + " " +
                     describe_layout(values_[static_cast<size_t>(step.dst)].md) +
                     data_type_suffix(values_[static_cast<size_t>(step.dst)].md) + " <-";
  for (size_t i = 0; i < nodes.size(); ++i) text += (i ? " + " : " ") + nodes[i];
  if (step.one_thread) text += " (on 1 thread)";
  step.text = std::move(text);
  steps_.push_back(std::move(step));
}

}  // namespace dpar::infer::detail
