// OnnxCalibrator: an eager evaluation of the exporter's graph IR with dpar's ops, recording
// the range of every Conv/Gemm data input. It evaluates exactly the graph that is quantized
// (after BatchNorm folding), so every recorded range belongs to a value of the file.
#include <algorithm>
#include <cmath>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/error.h"
#include "dpar/io/onnx_quantize.h"
#include "dpar/tensor/ops.h"

namespace dpar::io {

namespace {

std::vector<int64_t> ints_attr(const OnnxNode& n, const std::string& name,
                               std::vector<int64_t> def) {
  const OnnxAttribute* a = n.attribute(name);
  return a ? std::get<std::vector<int64_t>>(*a) : def;
}

int64_t int_attr(const OnnxNode& n, const std::string& name, int64_t def) {
  const OnnxAttribute* a = n.attribute(name);
  return a ? std::get<int64_t>(*a) : def;
}

float float_attr(const OnnxNode& n, const std::string& name, float def) {
  const OnnxAttribute* a = n.attribute(name);
  return a ? std::get<float>(*a) : def;
}

bool reads_quantizable(const OnnxGraph& g, const std::string& value) {
  for (const OnnxNode* n : g.consumers(value)) {
    if ((n->op_type == "Conv" || n->op_type == "Gemm") && n->inputs[0] == value) return true;
  }
  return false;
}

}  // namespace

OnnxCalibrator::OnnxCalibrator(const OnnxGraph& graph, CalibrationOptions options)
    : graph_(graph), options_(options) {
  DPAR_CHECK(options.method == CalibrationMethod::MinMax ||
                 (options.percentile > 50 && options.percentile <= 100),
             "calibration: the percentile must be in (50, 100], got ", options.percentile);
}

Tensor OnnxCalibrator::observe(const Tensor& batch) {
  DPAR_CHECK(batch.dtype() == DType::f32 && batch.dim() == 4, "calibration: expected an f32 ",
             "[N,C,H,W] batch, got ", batch.str());
  NoGradGuard no_grad;
  std::map<std::string, Tensor> values;
  std::map<std::string, int64_t> uses;  // to free values after their last reader
  for (const OnnxNode& n : graph_.nodes) {
    for (const std::string& in : n.inputs) ++uses[in];
  }
  values[graph_.input] = batch;
  auto get = [&](const std::string& name) -> Tensor {
    if (const Tensor* t = graph_.initializer(name)) return *t;
    auto it = values.find(name);
    DPAR_CHECK(it != values.end(), "calibration: value '", name, "' is not computed");
    return it->second;
  };
  auto record = [&](const std::string& name, const Tensor& x) {
    std::vector<float> v = x.to_float_vector();
    if (v.empty()) return;
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    Stats& s = stats_[name];
    s.min = batches_ == 0 ? *lo : std::min(s.min, *lo);
    s.max = batches_ == 0 ? *hi : std::max(s.max, *hi);
    if (options_.method == CalibrationMethod::Percentile) {
      // The k-th largest value with k = (1 - p/100) * n, and the mirror image at the bottom.
      const double tail = (100.0 - options_.percentile) / 100.0 * static_cast<double>(v.size());
      const size_t k = std::min(v.size() - 1, static_cast<size_t>(tail));
      std::nth_element(v.begin(), v.end() - 1 - static_cast<std::ptrdiff_t>(k), v.end());
      s.hi_sum += v[v.size() - 1 - k];
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
      s.lo_sum += v[k];
    }
  };
  if (reads_quantizable(graph_, graph_.input)) record(graph_.input, batch);
  for (const OnnxNode& n : graph_.nodes) {
    const std::string& op = n.op_type;
    Tensor y;
    if (op == "Conv") {
      const auto pads = ints_attr(n, "pads", {0, 0, 0, 0});
      DPAR_CHECK(pads.size() == 4 && pads[0] == pads[2] && pads[1] == pads[3],
                 "calibration: ", n.name, ": asymmetric pads are not supported");
      Conv2dOptions o;
      o.stride = ints_attr(n, "strides", {1, 1});
      o.padding = {pads[0], pads[1]};
      o.dilation = ints_attr(n, "dilations", {1, 1});
      o.groups = int_attr(n, "group", 1);
      y = conv2d(get(n.inputs[0]), get(n.inputs[1]),
                 n.inputs.size() > 2 ? get(n.inputs[2]) : Tensor(), o);
    } else if (op == "Gemm") {
      DPAR_CHECK(int_attr(n, "transB", 0) == 1 && int_attr(n, "transA", 0) == 0 &&
                     float_attr(n, "alpha", 1.f) == 1.f && float_attr(n, "beta", 1.f) == 1.f,
                 "calibration: ", n.name, ": only Gemm with transB=1, alpha=beta=1 is supported");
      y = linear(get(n.inputs[0]), get(n.inputs[1]),
                 n.inputs.size() > 2 ? get(n.inputs[2]) : Tensor());
    } else if (op == "Relu") {
      y = relu(get(n.inputs[0]));
    } else if (op == "HardSwish") {
      y = hardswish(get(n.inputs[0]));
    } else if (op == "HardSigmoid") {
      DPAR_CHECK(std::abs(float_attr(n, "alpha", 0.2f) - 1.f / 6.f) < 1e-6f &&
                     float_attr(n, "beta", 0.5f) == 0.5f,
                 "calibration: ", n.name, ": only HardSigmoid(alpha=1/6, beta=0.5) is supported");
      y = hardsigmoid(get(n.inputs[0]));
    } else if (op == "Sigmoid") {
      y = sigmoid(get(n.inputs[0]));
    } else if (op == "GlobalAveragePool") {
      y = global_avg_pool2d(get(n.inputs[0]));
    } else if (op == "Flatten") {
      DPAR_CHECK(int_attr(n, "axis", 1) == 1, "calibration: ", n.name, ": only axis 1");
      const Tensor x = get(n.inputs[0]).contiguous();
      y = x.reshape({x.size(0), x.numel() / x.size(0)});
    } else if (op == "Add") {
      y = add(get(n.inputs[0]), get(n.inputs[1]));
    } else if (op == "Mul") {
      y = mul(get(n.inputs[0]), get(n.inputs[1]));
    } else if (op == "BatchNormalization") {
      y = batch_norm(get(n.inputs[0]), get(n.inputs[1]), get(n.inputs[2]), get(n.inputs[3]),
                     get(n.inputs[4]), /*training=*/false, 0.0, float_attr(n, "epsilon", 1e-5f));
    } else if (op == "Softmax") {
      y = softmax(get(n.inputs[0]), int_attr(n, "axis", -1));
    } else {
      DPAR_FAIL("calibration: cannot evaluate ", op, " node ", n.name);
    }
    if (reads_quantizable(graph_, n.output)) record(n.output, y);
    values[n.output] = y;
    for (const std::string& in : n.inputs) {
      if (--uses[in] == 0 && in != graph_.output) values.erase(in);
    }
  }
  ++batches_;
  return get(graph_.output);
}

std::map<std::string, ActivationRange> OnnxCalibrator::ranges() const {
  std::map<std::string, ActivationRange> out;
  const double n = static_cast<double>(std::max<int64_t>(batches_, 1));
  for (const auto& [name, s] : stats_) {
    if (options_.method == CalibrationMethod::MinMax) {
      out[name] = {s.min, s.max};
    } else {
      out[name] = {static_cast<float>(s.lo_sum / n), static_cast<float>(s.hi_sum / n)};
    }
  }
  return out;
}

}  // namespace dpar::io
