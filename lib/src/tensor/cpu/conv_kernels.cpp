// CPU convolution on oneDNN. Activations are channels-last (nhwc), which oneDNN's jit kernels
// (1x1, direct and depthwise) consume without reorders. Weights are stored plain
// ([O,C/g,kH,kW], PyTorch's layout) but the primitives are created with format_tag::any so
// oneDNN picks its blocked weight layout; the small weight tensors are reordered per call,
// which costs far less than the reference kernels a plain weight layout can fall back to.
#include <optional>

#include "tensor/cpu/float_types.h"
#include "tensor/cpu/onednn_context.h"
#include "tensor/nn_kernels.h"

namespace dpar::cpu {

// depthwise_kernels.cpp: handles depthwise filters oneDNN has no fast kernel for; returns false
// for the shapes it leaves to oneDNN.
bool depthwise_backward_weights(const kernels::Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                                Tensor& dweight, Tensor& dbias);
// depthwise_stride2_kernels.cpp: the forward and input gradient of 3x3 stride-2 depthwise
// layers (f32, channels-last); false for the shapes it leaves to oneDNN.
bool depthwise3x3_stride2_forward(const kernels::Conv2dGeometry& g, const Tensor& x,
                                  const Tensor& weight, const Tensor& bias, Tensor& y);
bool depthwise3x3_stride2_backward_data(const kernels::Conv2dGeometry& g, const Tensor& dy,
                                        const Tensor& weight, Tensor& dx);
// few_channel_conv_kernels.cpp: the weight gradient of a stem's convolution (at most 4 input
// channels, 8/16/32 output channels); false for the shapes it leaves to oneDNN.
bool few_channel_conv_backward_weights(const kernels::Conv2dGeometry& g, const Tensor& x,
                                       const Tensor& dy, Tensor& dweight);

namespace {

using dnnl::memory;
using kernels::Conv2dGeometry;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

// The dtypes a convolution runs in: f32, or bf16 activations and weights under amp::Autocast
// (oneDNN accumulates in f32; the bias and the weight and bias gradients stay f32).
struct ConvTypes {
  DType activations = DType::f32;
  DType weights = DType::f32;
};

// The memory descriptors and geometry vectors shared by the three primitives.
struct ConvDescs {
  memory::desc src, dst, plain_weights, any_weights, bias;
  memory::dims strides, dilates, padding_l, padding_r;
};

ConvDescs make_descs(const Conv2dGeometry& g, ConvTypes types) {
  ConvDescs d;
  const auto act = onednn::data_type(types.activations, "conv2d");
  const auto wt = onednn::data_type(types.weights, "conv2d");
  d.src = memory::desc({g.N, g.C, g.H, g.W}, act, tag::nhwc);
  d.dst = memory::desc({g.N, g.O, g.OH, g.OW}, act, tag::nhwc);
  if (g.groups == 1) {
    const memory::dims w = {g.O, g.C, g.kH, g.kW};
    d.plain_weights = memory::desc(w, wt, tag::oihw);
    d.any_weights = memory::desc(w, wt, tag::any);
  } else {
    // Grouped weights are the 5-D goihw view of the same [O,C/g,kH,kW] memory.
    const memory::dims w = {g.groups, g.O / g.groups, g.C / g.groups, g.kH, g.kW};
    d.plain_weights = memory::desc(w, wt, tag::goihw);
    d.any_weights = memory::desc(w, wt, tag::any);
  }
  if (g.has_bias) d.bias = memory::desc({g.O}, f32, tag::x);
  d.strides = {g.stride[0], g.stride[1]};
  // oneDNN counts dilation from 0 (0 = dense kernel); PyTorch from 1.
  d.dilates = {g.dilation[0] - 1, g.dilation[1] - 1};
  // Symmetric padding, as PyTorch passes it: oneDNN's size check divides with floor like
  // PyTorch, and its kernels derive the effective right padding from the sizes.
  d.padding_l = {g.padding[0], g.padding[1]};
  d.padding_r = d.padding_l;
  return d;
}

onednn::Key conv_key(onednn::Kind kind, const Conv2dGeometry& g, bool training, ConvTypes types) {
  onednn::Key key(kind);
  key.add(static_cast<int64_t>(types.activations)).add(static_cast<int64_t>(types.weights));
  key.add(g.N).add(g.C).add(g.H).add(g.W).add(g.O).add(g.kH).add(g.kW).add(g.OH).add(g.OW);
  key.add(g.stride[0]).add(g.stride[1]).add(g.padding[0]).add(g.padding[1]);
  key.add(g.dilation[0]).add(g.dilation[1]).add(g.groups).add(g.has_bias).add(training);
  return key;
}

// A reorder between the plain weight layout and the layout a primitive chose, when they differ.
std::optional<dnnl::reorder> weight_reorder(const memory::desc& from, const memory::desc& to) {
  if (from == to) return std::nullopt;
  return dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), from, onednn::engine(), to));
}

struct ConvForward {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory::desc src, dst, plain_weights, weights, bias;
  std::optional<dnnl::reorder> to_weights;
};

const ConvForward& forward_entry(const Conv2dGeometry& g, bool training, ConvTypes types) {
  return onednn::cached<ConvForward>(conv_key(onednn::Kind::conv_forward, g, training, types), [&] {
    const ConvDescs d = make_descs(g, types);
    const auto prop =
        training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    dnnl::convolution_forward::desc desc(prop, dnnl::algorithm::convolution_direct, d.src,
                                         d.any_weights, d.bias, d.dst, d.strides, d.dilates,
                                         d.padding_l, d.padding_r);
    ConvForward e;
    e.pd =
        dnnl::convolution_forward::primitive_desc(desc, onednn::default_attr(), onednn::engine());
    e.prim = dnnl::convolution_forward(e.pd);
    e.src = d.src;
    e.dst = d.dst;
    e.plain_weights = d.plain_weights;
    e.weights = e.pd.weights_desc();
    e.bias = d.bias;
    e.to_weights = weight_reorder(d.plain_weights, e.weights);
    return e;
  });
}

struct ConvBackwardData {
  dnnl::convolution_backward_data::primitive_desc pd;
  dnnl::convolution_backward_data prim;
  memory::desc diff_src, diff_dst, plain_weights, weights;
  std::optional<dnnl::reorder> to_weights;
};

const ConvBackwardData& backward_data_entry(const Conv2dGeometry& g, ConvTypes types) {
  const onednn::Key key = conv_key(onednn::Kind::conv_backward_data, g, true, types);
  return onednn::cached<ConvBackwardData>(key, [&] {
    const ConvDescs d = make_descs(g, types);
    dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, d.src,
                                               d.any_weights, d.dst, d.strides, d.dilates,
                                               d.padding_l, d.padding_r);
    ConvBackwardData e;
    e.pd = dnnl::convolution_backward_data::primitive_desc(
        desc, onednn::default_attr(), onednn::engine(), forward_entry(g, true, types).pd);
    e.prim = dnnl::convolution_backward_data(e.pd);
    e.diff_src = d.src;
    e.diff_dst = d.dst;
    e.plain_weights = d.plain_weights;
    e.weights = e.pd.weights_desc();
    e.to_weights = weight_reorder(d.plain_weights, e.weights);
    return e;
  });
}

struct ConvBackwardWeights {
  dnnl::convolution_backward_weights::primitive_desc pd;
  dnnl::convolution_backward_weights prim;
  memory::desc src, diff_dst, plain_weights, diff_weights, diff_bias;
  std::optional<dnnl::reorder> to_plain;
};

// types.weights is the weight gradient's dtype (f32 also for bf16 activations: oneDNN
// accumulates the gradient in f32 and writes it unrounded); the forward it hints from runs in
// the activations' dtype.
const ConvBackwardWeights& backward_weights_entry(const Conv2dGeometry& g, ConvTypes types) {
  return onednn::cached<ConvBackwardWeights>(
      conv_key(onednn::Kind::conv_backward_weights, g, true, types), [&] {
        const ConvDescs d = make_descs(g, types);
        dnnl::convolution_backward_weights::desc desc(dnnl::algorithm::convolution_direct, d.src,
                                                      d.any_weights, d.bias, d.dst, d.strides,
                                                      d.dilates, d.padding_l, d.padding_r);
        ConvBackwardWeights e;
        e.pd = dnnl::convolution_backward_weights::primitive_desc(
            desc, onednn::default_attr(), onednn::engine(),
            forward_entry(g, true, {types.activations, types.activations}).pd);
        e.prim = dnnl::convolution_backward_weights(e.pd);
        e.src = d.src;
        e.diff_dst = d.dst;
        e.plain_weights = d.plain_weights;
        e.diff_weights = e.pd.diff_weights_desc();
        e.diff_bias = d.bias;
        e.to_plain = weight_reorder(e.diff_weights, d.plain_weights);
        return e;
      });
}

// The weights as the primitive wants them: the plain tensor itself, or a reordered copy.
memory weights_for(const memory::desc& plain, const memory::desc& wanted,
                   const std::optional<dnnl::reorder>& reorder, const Tensor& weight,
                   onednn::OwnedMemory& storage) {
  memory plain_mem = onednn::wrap(plain, weight);
  if (!reorder) return plain_mem;
  storage = onednn::allocate(wanted);
  reorder->execute(onednn::stream(), plain_mem, storage.memory);
  return storage.memory;
}

void conv2d_forward_cpu(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, Tensor& y, bool training) {
  require_same_float("conv2d", x, y, "the output");
  require_same_float("conv2d", x, weight, "the weight");
  if (depthwise3x3_stride2_forward(g, x, weight, bias, y)) return;
  const ConvForward& e = forward_entry(g, training, {x.dtype(), weight.dtype()});
  onednn::OwnedMemory reordered;
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, onednn::wrap(e.src, x)},
      {DNNL_ARG_WEIGHTS, weights_for(e.plain_weights, e.weights, e.to_weights, weight, reordered)},
      {DNNL_ARG_DST, onednn::wrap(e.dst, y)}};
  if (g.has_bias) args.emplace(DNNL_ARG_BIAS, onednn::wrap(e.bias, bias));
  onednn::execute(e.prim, e.pd.scratchpad_desc(), std::move(args));
}

// A depthwise convolution with stride 1 and "same" padding (an odd k x k filter, padding
// (k-1)/2) is its own transpose but for the filter's flip: dx = conv(dy, flip(w)) with the same
// geometry. oneDNN 2.6's depthwise backward-data kernel took 1.4-2.2x as long as its forward
// does on that problem for MobileNetV3-small's 5x5 layers (batch 16, one thread, AVX2, medians
// from ONEDNN_VERBOSE in one run each: 240 channels at 14x14 1.255 -> 0.776 ms, 576 at 7x7
// 0.898 -> 0.406), so from 5x5 these gradients run as forward convolutions; on the 3x3 layer
// (88 channels at 28x28) the forward was slower (0.693 -> 0.797). f32 only.
bool backward_data_as_forward(const Conv2dGeometry& g, const Tensor& dy, const Tensor& weight,
                              Tensor& dx) {
  const bool depthwise = g.groups == g.C && g.O == g.C;
  const bool same = g.kH == g.kW && g.kH % 2 == 1 && g.kH >= 5 && g.stride[0] == 1 &&
                    g.stride[1] == 1 && g.dilation[0] == 1 && g.dilation[1] == 1 &&
                    g.padding[0] == (g.kH - 1) / 2 && g.padding[1] == (g.kW - 1) / 2;
  if (!depthwise || !same || dy.dtype() != DType::f32 || !weight.is_contiguous()) return false;
  const int64_t taps = g.kH * g.kW;
  Tensor flipped = Tensor::empty(weight.shape(), DType::f32, weight.device());
  const float* w = weight.data<float>();
  float* f = flipped.data<float>();
  for (int64_t c = 0; c < g.C; ++c) {
    for (int64_t t = 0; t < taps; ++t) f[c * taps + t] = w[c * taps + taps - 1 - t];
  }
  Conv2dGeometry forward = g;
  forward.has_bias = false;
  conv2d_forward_cpu(forward, dy, flipped, Tensor(), dx, /*training=*/false);
  return true;
}

void conv2d_backward_data_cpu(const Conv2dGeometry& g, const Tensor& dy, const Tensor& weight,
                              Tensor& dx) {
  require_same_float("conv2d", dy, dx, "the input gradient");
  require_same_float("conv2d", dy, weight, "the weight");
  if (backward_data_as_forward(g, dy, weight, dx)) return;
  if (depthwise3x3_stride2_backward_data(g, dy, weight, dx)) return;
  const ConvBackwardData& e = backward_data_entry(g, {dy.dtype(), weight.dtype()});
  onednn::OwnedMemory reordered;
  onednn::execute(
      e.prim, e.pd.scratchpad_desc(),
      {{DNNL_ARG_DIFF_DST, onednn::wrap(e.diff_dst, dy)},
       {DNNL_ARG_WEIGHTS, weights_for(e.plain_weights, e.weights, e.to_weights, weight, reordered)},
       {DNNL_ARG_DIFF_SRC, onednn::wrap(e.diff_src, dx)}});
}

// A 1x1 convolution's weight gradient as one matrix product over the M = N*H*W rows of the
// channels-last activations: dweight[O, C] = dy[M, O]^T x[M, C]. oneDNN 2.6's jit_1x1 weight
// gradient (plus the reorder of its blocked result to the plain layout) took 10-45% longer
// than its sgemm on MobileNetV3-small's 1x1 layers with 24 or more input channels (batch 16,
// one thread, AVX2: 16.0 -> 12.9 ms per step over those layers) and ~30% less with 16 input
// channels, which stay with the convolution. f32 without a bias only: the SE blocks' biased
// layers on 1x1 maps are tiny.
bool backward_weights_as_gemm(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                              Tensor& dweight) {
  constexpr int64_t kMinInputChannels = 24;
  const bool pointwise = g.kH == 1 && g.kW == 1 && g.groups == 1 && g.stride[0] == 1 &&
                         g.stride[1] == 1 && g.padding[0] == 0 && g.padding[1] == 0;
  if (!pointwise || g.has_bias || g.C < kMinInputChannels || x.dtype() != DType::f32 ||
      dy.dtype() != DType::f32 || dweight.dtype() != DType::f32 ||
      !x.is_contiguous(MemoryFormat::ChannelsLast) ||
      !dy.is_contiguous(MemoryFormat::ChannelsLast) || !dweight.is_contiguous()) {
    return false;
  }
  const dnnl_dim_t M = g.N * g.H * g.W;
  const dnnl_status_t status = dnnl_sgemm('T', 'N', g.O, g.C, M, 1.f, dy.data<float>(), g.O,
                                          x.data<float>(), g.C, 0.f, dweight.data<float>(), g.C);
  DPAR_CHECK(status == dnnl_success, "conv2d backward: oneDNN's sgemm failed (status ",
             static_cast<int>(status), ") for the weight gradient of a 1x1 convolution ", g.C,
             " -> ", g.O, " channels over ", M, " rows");
  return true;
}

void conv2d_backward_weights_cpu(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                                 Tensor& dweight, Tensor& dbias) {
  require_same_float("conv2d", x, dy, "the output gradient");
  if (depthwise_backward_weights(g, x, dy, dweight, dbias)) return;
  if (backward_weights_as_gemm(g, x, dy, dweight)) return;
  if (few_channel_conv_backward_weights(g, x, dy, dweight)) return;
  const ConvBackwardWeights& e = backward_weights_entry(g, {x.dtype(), dweight.dtype()});
  memory plain = onednn::wrap(e.plain_weights, dweight);
  onednn::OwnedMemory blocked;
  if (e.to_plain) blocked = onednn::allocate(e.diff_weights);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, onednn::wrap(e.src, x)},
      {DNNL_ARG_DIFF_DST, onednn::wrap(e.diff_dst, dy)},
      {DNNL_ARG_DIFF_WEIGHTS, e.to_plain ? blocked.memory : plain}};
  if (g.has_bias) args.emplace(DNNL_ARG_DIFF_BIAS, onednn::wrap(e.diff_bias, dbias));
  onednn::execute(e.prim, e.pd.scratchpad_desc(), std::move(args));
  if (e.to_plain) {
    e.to_plain->execute(onednn::stream(), blocked.memory, plain);
    onednn::stream().wait();
  }
}

}  // namespace

void register_norm_kernels();
void register_pool_kernels();

void register_nn_kernels() {
  kernels::conv2d_forward.set(DeviceType::CPU, &conv2d_forward_cpu);
  kernels::conv2d_backward_data.set(DeviceType::CPU, &conv2d_backward_data_cpu);
  kernels::conv2d_backward_weights.set(DeviceType::CPU, &conv2d_backward_weights_cpu);
  register_norm_kernels();
  register_pool_kernels();
}

}  // namespace dpar::cpu
