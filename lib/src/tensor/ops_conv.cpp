// conv2d: argument checks, layout preparation and the autograd record. The kernels see
// channels-last activations; weights are plain contiguous for oneDNN on the CPU and
// channels-last on CUDA, where cuDNN wants the filter in the activations' layout (as PyTorch's
// channels_last models have it).
#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
#include "tensor/broadcast.h"
#include "tensor/elementwise_kernels.h"
#include "tensor/nn_kernels.h"

namespace dpar {
namespace {

// Reads a per-dimension option given as {v} or {vH, vW}.
void read_pair(const std::vector<int64_t>& v, const char* name, int64_t out[2]) {
  DPAR_CHECK(v.size() == 1 || v.size() == 2, "conv2d: ", name, " needs 1 or 2 values, got ", v);
  out[0] = v[0];
  out[1] = v.size() == 2 ? v[1] : v[0];
}

void check_f32(const Tensor& t, const char* which) {
  DPAR_CHECK(t.dtype() == DType::f32, "conv2d: ", which, " has dtype ", t.dtype(), " (shape ",
             t.shape(), "); conv2d supports f32");
}

kernels::Conv2dGeometry make_geometry(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                      const Conv2dOptions& options) {
  DPAR_CHECK(x.defined(), "conv2d: input is undefined");
  DPAR_CHECK(weight.defined(), "conv2d: weight is undefined");
  DPAR_CHECK(x.dim() == 4, "conv2d: expected a 4-D input [N,C,H,W], got ", x.shape());
  DPAR_CHECK(weight.dim() == 4, "conv2d: expected a 4-D weight [O,C/groups,kH,kW], got ",
             weight.shape());
  // f16/bf16 inputs (bf16 on the CPU): the activations amp::Autocast passes between ops.
  DPAR_CHECK(detail::elementwise_dtype_ok(x), "conv2d: input has dtype ", x.dtype(), " (shape ",
             x.shape(), ") on ", x.device(),
             "; conv2d supports f32 (f16/bf16 on CUDA, bf16 on the CPU)");
  check_f32(weight, "weight");
  DPAR_CHECK(x.device() == weight.device(), "conv2d: input on ", x.device(), " but weight on ",
             weight.device());

  kernels::Conv2dGeometry g;
  g.N = x.size(0);
  g.C = x.size(1);
  g.H = x.size(2);
  g.W = x.size(3);
  g.O = weight.size(0);
  g.kH = weight.size(2);
  g.kW = weight.size(3);
  g.groups = options.groups;
  read_pair(options.stride, "stride", g.stride);
  read_pair(options.padding, "padding", g.padding);
  read_pair(options.dilation, "dilation", g.dilation);

  DPAR_CHECK(g.C > 0 && g.H > 0 && g.W > 0, "conv2d: input ", x.shape(),
             " has an empty channel or spatial dimension");
  DPAR_CHECK(g.O > 0 && g.kH > 0 && g.kW > 0 && weight.size(1) > 0, "conv2d: weight ",
             weight.shape(), " has an empty dimension");
  DPAR_CHECK(g.groups >= 1, "conv2d: groups must be >= 1, got ", g.groups);
  DPAR_CHECK(g.C % g.groups == 0, "conv2d: groups ", g.groups, " does not divide the ", g.C,
             " input channels of input ", x.shape());
  DPAR_CHECK(g.O % g.groups == 0, "conv2d: groups ", g.groups, " does not divide the ", g.O,
             " output channels of weight ", weight.shape());
  DPAR_CHECK(weight.size(1) * g.groups == g.C, "conv2d: input ", x.shape(), " has ", g.C,
             " channels but weight ", weight.shape(), " with groups ", g.groups, " expects ",
             weight.size(1) * g.groups);
  for (int i = 0; i < 2; ++i) {
    DPAR_CHECK(g.stride[i] > 0, "conv2d: stride must be positive, got ", options.stride);
    DPAR_CHECK(g.dilation[i] > 0, "conv2d: dilation must be positive, got ", options.dilation);
    DPAR_CHECK(g.padding[i] >= 0, "conv2d: padding must be non-negative, got ", options.padding);
  }
  const int64_t extent_h = (g.kH - 1) * g.dilation[0] + 1;
  const int64_t extent_w = (g.kW - 1) * g.dilation[1] + 1;
  DPAR_CHECK(extent_h <= g.H + 2 * g.padding[0] && extent_w <= g.W + 2 * g.padding[1],
             "conv2d: kernel ", Shape{g.kH, g.kW}, " with dilation ", options.dilation, " (extent ",
             Shape{extent_h, extent_w}, ") is larger than the padded input (input ", x.shape(),
             ", padding ", options.padding, ")");
  g.OH = (g.H + 2 * g.padding[0] - extent_h) / g.stride[0] + 1;
  g.OW = (g.W + 2 * g.padding[1] - extent_w) / g.stride[1] + 1;

  if (bias.defined()) {
    check_f32(bias, "bias");
    DPAR_CHECK(bias.dim() == 1 && bias.size(0) == g.O, "conv2d: bias must have shape [", g.O,
               "] to match weight ", weight.shape(), ", got ", bias.shape());
    DPAR_CHECK(bias.device() == x.device(), "conv2d: input on ", x.device(), " but bias on ",
               bias.device());
    g.has_bias = true;
  }
  return g;
}

// On CUDA the bias is added, and its gradient reduced, by dpar's own f32 kernels after cuDNN's
// convolution, as PyTorch does: cudnnAddTensor / cudnnConvolutionBackwardBias may refuse bf16,
// and under autocast they would round in f16/bf16. oneDNN fuses the bias on the CPU.
bool bias_in_conv_kernel(Device device) { return !device.is_cuda(); }

// y[n, o, h, w] += bias[o], in y's dtype (an f16/bf16 y under autocast gets the bias rounded to
// it, as cuDNN's fused bias would).
void add_channel_bias(Tensor& y, const Tensor& bias) {
  const Tensor b =
      detail::cast_for_compute(bias.detach(), y.dtype()).reshape({1, bias.size(0), 1, 1});
  kernels::binary.get(y.device())(kernels::BinaryOp::add, y, detail::expand_to(b, y.shape()), y);
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  DPAR_PROFILE_SCOPE("conv2d");
  const kernels::Conv2dGeometry g = make_geometry(x, weight, bias, options);
  const Device device = x.device();
  // The geometry the kernels see: without the bias where the op adds it itself.
  kernels::Conv2dGeometry kg = g;
  kg.has_bias = g.has_bias && bias_in_conv_kernel(device);
  const Tensor xc = detail::nn_layout_copy(x, MemoryFormat::ChannelsLast);
  const MemoryFormat weight_format =
      device.is_cuda() ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  // Under autocast (CUDA f16/bf16, CPU bf16) the convolution runs in that dtype on casts of its
  // operands and its result stays in it (or comes back as f32: DPAR_AMP_ACTIVATIONS=f32); the
  // backward uses the same dtype and returns each gradient in its input's dtype
  // (amp::Autocast). Without autocast an f16/bf16 input is computed in f32 with an f32 result,
  // as linear and matmul take one.
  const DType compute = detail::autocast_compute_dtype(device);
  const DType out_dtype = detail::autocast_output_dtype(compute);
  const DType x_dtype = x.dtype();
  const Tensor xh = detail::cast_for_compute(xc, compute);
  const Tensor wc =
      detail::cast_for_compute(detail::nn_layout_copy(weight, weight_format), compute);
  // The dtype of the bias oneDNN adds (CPU) and of the weight and bias gradients the kernels
  // write: f32 on the CPU, where oneDNN takes an f32 bias and writes f32 gradients from bf16
  // operands (no rounding of either); the compute dtype on CUDA.
  const DType param_dtype = device.is_cuda() ? compute : DType::f32;
  const Tensor bc = kg.has_bias
                        ? detail::cast_for_compute(
                              detail::nn_layout_copy(bias, MemoryFormat::Contiguous), param_dtype)
                        : Tensor();
  Tensor y = Tensor::empty({g.N, g.O, g.OH, g.OW}, compute, device, MemoryFormat::ChannelsLast);
  const bool grad = autograd::needs_grad({x, weight, bias});
  if (g.N > 0) kernels::conv2d_forward.get(device)(kg, xh, wc, bc, y, grad);
  y = detail::cast_for_compute(y, out_dtype);
  if (g.has_bias && !kg.has_bias) add_channel_bias(y, bias);
  if (!grad) return y;

  // Save only what the needed gradients read: dx needs the weights, dweight/dbias the input.
  const bool params_need_grad = weight.requires_grad() || (kg.has_bias && bias.requires_grad());
  autograd::record(
      "conv2d", {x, weight, bias}, {y},
      [g, kg, xs = params_need_grad ? autograd::SavedTensor(xh) : autograd::SavedTensor(),
       ws = x.requires_grad() ? wc.detach() : Tensor(), weight_format, compute, param_dtype,
       x_dtype, device](const autograd::GradList& grads, const autograd::NeedsGrad& need) {
        const Tensor dy = detail::cast_for_compute(
            detail::nn_layout_copy(grads[0], MemoryFormat::ChannelsLast), compute);
        Tensor dx, dw, db;
        if (need[0]) {
          dx = Tensor::empty({g.N, g.C, g.H, g.W}, compute, device, MemoryFormat::ChannelsLast);
          if (g.N > 0) {
            kernels::conv2d_backward_data.get(device)(kg, dy, ws, dx);
          } else {
            dx.zero_();
          }
        }
        if (need[1] || (kg.has_bias && need[2])) {
          dw = Tensor::empty({g.O, g.C / g.groups, g.kH, g.kW}, param_dtype, device, weight_format);
          if (kg.has_bias) db = Tensor::empty({g.O}, param_dtype, device);
          if (g.N > 0) {
            kernels::conv2d_backward_weights.get(device)(kg, xs.get(), dy, dw, db);
          } else {
            dw.zero_();
            if (db.defined()) db.zero_();
          }
        }
        // The bias gradient the op owns: the output gradient summed over N, H and W into f32
        // (from f16/bf16 too, without a rounding in between).
        if (g.has_bias && !kg.has_bias && need[2]) {
          db = Tensor::empty({1, g.O, 1, 1}, DType::f32, device);
          kernels::sum_to.get(device)(grads[0], db);
          db = db.reshape({g.O});
        }
        // The input's gradient in its dtype; the master weights' in f32.
        return autograd::GradList{detail::cast_for_compute(dx, x_dtype),
                                  need[1] ? detail::cast_for_compute(dw, DType::f32) : Tensor(),
                                  need[2] ? detail::cast_for_compute(db, DType::f32) : Tensor()};
      });
  return y;
}

}  // namespace dpar
