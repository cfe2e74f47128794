// dpar::infer on dpar's tensor ops (see op_executor.h).
#include "infer/op_executor.h"

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/autocast.h"
#include "dpar/tensor/ops.h"

namespace dpar::infer::detail {
namespace {

Tensor on(const Tensor& t, Device device, bool channels_last) {
  if (!t.defined()) return t;
  Tensor there = t.to(device);
  return channels_last && there.dim() == 4 ? there.contiguous(MemoryFormat::ChannelsLast) : there;
}

// min(max(x, lo), hi) from ReLUs: lo + relu(x - lo) - relu(x - hi), exact for finite x.
Tensor clip(const Tensor& x, float lo, float hi) {
  return add(sub(relu(add(x, -static_cast<double>(lo))), relu(add(x, -static_cast<double>(hi)))),
             static_cast<double>(lo));
}

Tensor apply(const Eltwise& e, const Tensor& x) {
  switch (e.alg) {
    case dnnl::algorithm::eltwise_relu:
      // alpha is LeakyRelu's negative slope: relu(x) - alpha * relu(-x).
      if (e.alpha == 0.f) return relu(x);
      return sub(relu(x), mul(relu(neg(x)), static_cast<double>(e.alpha)));
    case dnnl::algorithm::eltwise_hardswish:
      return hardswish(x);
    case dnnl::algorithm::eltwise_logistic:
      return sigmoid(x);
    case dnnl::algorithm::eltwise_tanh:
      return add(mul(sigmoid(mul(x, 2.0)), 2.0), -1.0);  // tanh(x) = 2 sigmoid(2x) - 1
    case dnnl::algorithm::eltwise_linear:
      return add(mul(x, static_cast<double>(e.alpha)), static_cast<double>(e.beta));
    case dnnl::algorithm::eltwise_clip:
      return clip(x, e.alpha, e.beta);
    default:
      DPAR_FAIL("infer: unsupported activation in the op executor");
  }
}

Tensor apply_all(const std::vector<Eltwise>& acts, Tensor x) {
  // HardSigmoid lowers to linear(1/6, 1/2) then clip(0, 1): dpar has that as one op.
  if (acts.size() == 2 && acts[0].alg == dnnl::algorithm::eltwise_linear &&
      acts[1].alg == dnnl::algorithm::eltwise_clip && acts[0].alpha == 1.f / 6 &&
      acts[0].beta == 0.5f && acts[1].alpha == 0.f && acts[1].beta == 1.f) {
    return hardsigmoid(x);
  }
  for (const Eltwise& e : acts) x = apply(e, x);
  return x;
}

}  // namespace

OpExecutor::OpExecutor(const Program& program, Device device, DType compute)
    : program_(program), device_(device), compute_(compute) {
  DPAR_CHECK(compute == DType::f32 || device.is_cuda(), program.path, ": ", dtype_name(compute),
             " inference runs on a GPU; ", device.str(), " computes in f32");
  constants_.resize(program.constants.size());
  for (size_t v = 0; v < program.constants.size(); ++v) {
    constants_[v] = on(program.constants[v], device, false);
  }
  weights_.resize(program.ops.size());
  biases_.resize(program.ops.size());
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const Op& op = program.ops[i];
    const std::string where = program.path + ": " + op.nodes[0];
    DPAR_CHECK(!op.int8.on && !op.int8.f32, where,
               " runs in int8, which dpar::infer runs only on the CPU ",
               "(oneDNN); use an fp32 model on ", device.str());
    if (op.kind == OpKind::Conv) {
      const bool symmetric = op.auto_pad == "NOTSET" || op.auto_pad == "VALID";
      DPAR_CHECK(symmetric && op.pads[0] == op.pads[2] && op.pads[1] == op.pads[3], where,
                 " has asymmetric padding (auto_pad ", op.auto_pad, ", pads ", op.pads[0], ",",
                 op.pads[1], ",", op.pads[2], ",", op.pads[3], "), which conv2d on ", device.str(),
                 " does not take");
    }
    weights_[i] = on(op.weight, device, device.is_cuda());
    biases_[i] = on(op.bias, device, false);
  }
}

Tensor OpExecutor::run(const Tensor& input) const {
  NoGradGuard no_grad;
  // f16/bf16: convolutions and Gemm on the tensor cores, their results kept in that dtype for
  // the pointwise ops, pooling and adds after them; softmax runs in f32 (amp::Autocast).
  amp::Autocast autocast(compute_, compute_ != DType::f32);
  std::vector<Tensor> values = constants_;
  values[static_cast<size_t>(program_.input)] = input.to(device_);
  for (size_t i = 0; i < program_.ops.size(); ++i) {
    const Op& op = program_.ops[i];
    const Tensor& x = values[static_cast<size_t>(op.src)];
    Tensor y;
    switch (op.kind) {
      case OpKind::Conv: {
        Conv2dOptions options;
        options.stride = {op.stride[0], op.stride[1]};
        options.padding = op.auto_pad == "VALID" ? std::vector<int64_t>{0, 0}
                                                 : std::vector<int64_t>{op.pads[0], op.pads[1]};
        options.dilation = {op.dilation[0], op.dilation[1]};
        options.groups = op.groups;
        y = apply_all(op.acts, conv2d(x, weights_[i], biases_[i], options));
        break;
      }
      case OpKind::Gemm:
        y = apply_all(op.acts, linear(x, weights_[i], biases_[i]));
        break;
      case OpKind::Eltwise:
        y = apply_all(op.acts, x);
        break;
      case OpKind::Binary: {
        const Tensor& b = values[static_cast<size_t>(op.src2)];
        y = op.binary_alg == dnnl::algorithm::binary_add ? add(x, b) : mul(x, b);
        y = apply_all(op.acts, y);
        break;
      }
      case OpKind::GlobalAvgPool:
        y = global_avg_pool2d(x);
        break;
      case OpKind::Flatten: {
        const int64_t r = x.dim();
        const int64_t axis = op.axis < 0 ? op.axis + r : op.axis;
        int64_t rows = 1, cols = 1;
        for (int64_t d = 0; d < r; ++d) (d < axis ? rows : cols) *= x.size(d);
        y = x.reshape({rows, cols});
        break;
      }
      case OpKind::Softmax:
        if (op.softmax_coerce_2d) {
          // Opset < 13: softmax over everything from axis on, as one flattened dimension.
          const int64_t r = x.dim();
          const int64_t axis = op.axis < 0 ? op.axis + r : op.axis;
          int64_t rows = 1, cols = 1;
          for (int64_t d = 0; d < r; ++d) (d < axis ? rows : cols) *= x.size(d);
          y = softmax(x.reshape({rows, cols}), 1).reshape(x.shape());
        } else {
          y = softmax(x, op.axis);
        }
        break;
    }
    values[static_cast<size_t>(op.dst)] = y;
  }
  // Under f16/bf16 the activations between ops stay in that dtype (amp::Autocast); the caller
  // gets f32, as from an f32 model.
  return values[static_cast<size_t>(program_.output)].contiguous().to(DType::f32);
}

}  // namespace dpar::infer::detail
