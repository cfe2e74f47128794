// quantize_qdq: the calibrated f32 graph -> a QDQ graph (see dpar/io/onnx_quantize.h).
#include "dpar/io/onnx_quantize.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dpar/core/error.h"

namespace dpar::io {

namespace {

// ONNX QuantizeLinear rounds half to even; std::nearbyint does in the default rounding mode.
float round_half_even(float x) { return std::nearbyint(x); }

class QdqPass {
 public:
  QdqPass(OnnxGraph& g, std::map<std::string, ActivationRange> ranges)
      : g_(g), ranges_(std::move(ranges)) {
    names_.insert(g_.input);
    for (const auto& [name, t] : g_.initializers) names_.insert(name);
    for (const OnnxNode& n : g_.nodes) {
      names_.insert(n.output);
      names_.insert(n.name);
    }
  }

  QuantizeResult run() {
    std::vector<OnnxNode> out;
    for (OnnxNode& n : g_.nodes) {
      if (n.op_type == "Conv" || n.op_type == "Gemm") {
        if (n.op_type == "Gemm") {
          const OnnxAttribute* t = n.attribute("transB");
          DPAR_CHECK(t && std::get<int64_t>(*t) == 1, "quantize: Gemm ", n.name,
                     " needs transB=1 (weights [out, in]) for per-output-channel scales");
        }
        n.inputs[0] = activation(n.inputs[0], out);
        n.inputs[1] = weight(n.inputs[1], out);
        ++result_.quantized_nodes;
      }
      out.push_back(std::move(n));
    }
    g_.nodes = std::move(out);
    std::erase_if(g_.initializers,
                  [&](const auto& entry) { return replaced_weights_.count(entry.first) != 0; });
    return result_;
  }

 private:
  std::string unique(const std::string& base) {
    std::string name = base;
    for (int i = 1; names_.count(name); ++i) name = base + "_" + std::to_string(i);
    names_.insert(name);
    return name;
  }

  std::string add_initializer(const std::string& base, Tensor t, const char* quantized = nullptr) {
    const std::string name = unique(base);
    g_.initializers.emplace_back(name, std::move(t));
    if (quantized) g_.quantized_initializers[name] = quantized;
    return name;
  }

  std::string add_node(std::vector<OnnxNode>& out, const std::string& op, const std::string& base,
                       std::vector<std::string> inputs, OnnxAttributes attrs = {}) {
    OnnxNode n;
    n.op_type = op;
    n.name = n.output = unique(base + "/" + op);
    n.inputs = std::move(inputs);
    n.attributes = std::move(attrs);
    out.push_back(std::move(n));
    return out.back().output;
  }

  // x -> QuantizeLinear -> DequantizeLinear, once per value (shared by all its readers).
  std::string activation(const std::string& x, std::vector<OnnxNode>& out) {
    if (auto it = dequantized_.find(x); it != dequantized_.end()) return it->second;
    auto r = ranges_.find(x);
    DPAR_CHECK(r != ranges_.end(), "quantize: no calibration range for '", x, "'");
    const bool is_unsigned = r->second.min >= 0.f;
    const float amax = std::max(std::abs(r->second.min), std::abs(r->second.max));
    // A value that was 0 throughout calibration still needs a positive scale.
    const float scale = std::max(amax, 1e-8f) / (is_unsigned ? 255.f : 127.f);
    ++(is_unsigned ? result_.uint8_activations : result_.int8_activations);
    const std::string s = add_initializer(x + ".scale", Tensor::full({}, scale));
    const std::string zp =
        add_initializer(x + ".zero_point", Tensor::zeros({}), is_unsigned ? "uint8" : "int8");
    const std::string q = add_node(out, "QuantizeLinear", x, {x, s, zp});
    return dequantized_[x] = add_node(out, "DequantizeLinear", x, {q, s, zp});
  }

  // w [O, ...] f32 -> int8 initializer + per-output-channel DequantizeLinear (axis 0).
  std::string weight(const std::string& w, std::vector<OnnxNode>& out) {
    const Tensor* t = g_.initializer(w);
    DPAR_CHECK(t != nullptr, "quantize: weight '", w, "' is not a constant");
    DPAR_CHECK(uses(w) == 1 && !replaced_weights_.count(w), "quantize: weight '", w,
               "' is shared by several nodes");
    const int64_t o = t->size(0);
    std::vector<float> v = t->to_float_vector();
    const size_t per = v.size() / static_cast<size_t>(o);
    std::vector<float> scales(static_cast<size_t>(o));
    for (size_t c = 0; c < scales.size(); ++c) {
      float amax = 0;
      for (size_t k = 0; k < per; ++k) amax = std::max(amax, std::abs(v[c * per + k]));
      scales[c] = amax > 0 ? amax / 127.f : 1.f;
      for (size_t k = 0; k < per; ++k) {
        float& x = v[c * per + k];
        x = std::clamp(round_half_even(x / scales[c]), -127.f, 127.f);
      }
    }
    const std::string& base = w;  // "features.0.0.weight" -> "features.0.0.weight_quantized"
    const std::string q =
        add_initializer(base + "_quantized", Tensor::from_vector(v, t->shape()), "int8");
    const std::string s = add_initializer(base + "_scale", Tensor::from_vector(scales, {o}));
    const std::string zp = add_initializer(base + "_zero_point", Tensor::zeros({o}), "int8");
    replaced_weights_.insert(w);
    return add_node(out, "DequantizeLinear", w, {q, s, zp}, {{"axis", int64_t{0}}});
  }

  int64_t uses(const std::string& value) const {
    int64_t n = 0;
    for (const OnnxNode& node : g_.nodes) {
      n += std::count(node.inputs.begin(), node.inputs.end(), value);
    }
    return n;
  }

  OnnxGraph& g_;
  std::map<std::string, ActivationRange> ranges_;
  std::set<std::string> names_;
  std::map<std::string, std::string> dequantized_;  // activation -> its DequantizeLinear output
  std::set<std::string> replaced_weights_;
  QuantizeResult result_;
};

}  // namespace

QuantizeResult quantize_qdq(OnnxGraph& graph, const OnnxCalibrator& calibrator) {
  DPAR_CHECK(calibrator.batches() > 0, "quantize: the calibrator has seen no batch");
  return QdqPass(graph, calibrator.ranges()).run();
}

}  // namespace dpar::io
