// QDQ models: finds the QuantizeLinear -> DequantizeLinear pairs and the dequantized int8
// weights that Conv and Gemm read, and rejects every other use of them. dpar::infer runs a
// quantized Conv/Gemm as a oneDNN int8 primitive; a pair around any other op would have to
// run in int8 too (that is what the file asks for), and dpar has no int8 kernel for it, so
// such a file is an error naming the node instead of a silent f32 simulation.
#include <cmath>

#include "infer/graph.h"

namespace dpar::infer::detail {

namespace {

class QdqResolver {
 public:
  explicit QdqResolver(const Graph& g) : g_(g) {
    for (const Node& n : g_.nodes) {
      for (size_t k = 0; k < n.inputs.size(); ++k) readers_[n.inputs[k]].push_back({&n, k});
      for (const std::string& out : n.outputs) producer_[out] = &n;
    }
  }

  Qdq run() {
    for (const Node& n : g_.nodes) {
      if (n.op == "QuantizeLinear") check_quantize(n);
      if (n.op == "DequantizeLinear") dequantize(n);
    }
    for (const Node& n : g_.nodes) {
      if (n.op != "Conv" && n.op != "Gemm") continue;
      const bool act = n.inputs.size() > 0 && out_.activations.count(n.inputs[0]);
      const bool wei = n.inputs.size() > 1 && out_.weights.count(n.inputs[1]);
      DPAR_CHECK(act == wei, g_.path, ": ", n.label(), ": its ", act ? "input" : "weight",
                 " is quantized (QuantizeLinear/DequantizeLinear) but its ",
                 act ? "weight" : "input",
                 " is not; dpar::infer runs int8 Conv/Gemm only with "
                 "both quantized");
    }
    return std::move(out_);
  }

 private:
  struct Reader {
    const Node* node;
    size_t input;
  };

  const std::vector<Reader>& readers(const std::string& v) const {
    static const std::vector<Reader> none;
    auto it = readers_.find(v);
    return it == readers_.end() ? none : it->second;
  }

  // Scale (f32 initializer) and zero point (int8/uint8 initializer, default uint8 0) of a
  // QuantizeLinear or DequantizeLinear.
  std::vector<float> scales(const Node& n) const {
    DPAR_CHECK(n.inputs.size() >= 2 && !n.inputs[1].empty(), g_.path, ": ", n.label(),
               " has no scale");
    auto it = g_.initializers.find(n.inputs[1]);
    DPAR_CHECK(it != g_.initializers.end() && it->second.dtype() == DType::f32, g_.path, ": ",
               n.label(), ": the scale '", n.inputs[1], "' must be a FLOAT initializer");
    std::vector<float> s = it->second.to_float_vector();
    for (float v : s) {
      DPAR_CHECK(v > 0 && std::isfinite(v), g_.path, ": ", n.label(), ": scale ", v,
                 " is not a positive number");
    }
    return s;
  }

  // True for uint8; checks that every zero point is 0.
  bool zero_point_unsigned(const Node& n) const {
    if (n.inputs.size() < 3 || n.inputs[2].empty()) return true;  // ONNX default: uint8 0
    auto it = g_.quantized.find(n.inputs[2]);
    DPAR_CHECK(it != g_.quantized.end(), g_.path, ": ", n.label(), ": the zero point '",
               n.inputs[2], "' must be an INT8 or UINT8 initializer");
    for (int64_t i = 0; i < it->second.bytes.numel(); ++i) {
      DPAR_CHECK(it->second.at(i) == 0, g_.path, ": ", n.label(), ": zero point ", it->second.at(i),
                 "; dpar::infer runs int8 with zero point 0 only (symmetric "
                 "quantization)");
    }
    return !it->second.is_signed;
  }

  void check_quantize(const Node& q) {
    DPAR_CHECK(q.outputs.size() == 1 && q.outputs[0] != g_.outputs[0], g_.path, ": ", q.label(),
               ": the graph output is quantized; dpar::infer returns f32 outputs only");
    DPAR_CHECK(q.get_int("saturate", 1) == 1 && q.get_string("output_dtype", "") == "", g_.path,
               ": ", q.label(), ": unsupported attributes");
    scales(q);
    zero_point_unsigned(q);
    for (const Reader& r : readers(q.outputs[0])) {
      DPAR_CHECK(r.node->op == "DequantizeLinear" && r.input == 0, g_.path, ": ", r.node->label(),
                 " reads the int8 output of ", q.label(),
                 "; dpar::infer has no int8 kernel for it (it runs only QuantizeLinear -> "
                 "DequantizeLinear into Conv and Gemm in int8)");
    }
  }

  void dequantize(const Node& d) {
    const std::string& in = d.inputs.at(0);
    const std::vector<float> s = scales(d);
    const bool is_unsigned = zero_point_unsigned(d);
    auto prod = producer_.find(in);
    if (prod != producer_.end() && prod->second->op == "QuantizeLinear") {
      const Node& q = *prod->second;
      const std::vector<float> qs = scales(q);
      const bool q_unsigned = zero_point_unsigned(q);
      DPAR_CHECK(s.size() == 1 && qs.size() == 1, g_.path, ": ", d.label(),
                 ": per-channel activation quantization is not supported (one scale per tensor)");
      DPAR_CHECK(qs[0] == s[0] && q_unsigned == is_unsigned, g_.path, ": ", d.label(),
                 " dequantizes with another scale or type than ", q.label(), " quantized");
      for (const Reader& r : readers(d.outputs[0])) {
        DPAR_CHECK((r.node->op == "Conv" || r.node->op == "Gemm") && r.input == 0, g_.path, ": ",
                   r.node->label(), " has a QuantizeLinear/DequantizeLinear pair (", q.label(),
                   ", ", d.label(), ") on its input ", r.input,
                   ", but dpar::infer has no int8 kernel for it (only Conv and Gemm run in int8)");
      }
      DPAR_CHECK(d.outputs[0] != g_.outputs[0], g_.path, ": ", d.label(),
                 " computes the graph output; nothing runs in int8");
      out_.activations[d.outputs[0]] = {q.inputs.at(0), s[0], is_unsigned};
      return;
    }
    auto w = g_.quantized.find(in);
    DPAR_CHECK(w != g_.quantized.end(), g_.path, ": ", d.label(), " reads '", in,
               "', which is neither an INT8/UINT8 initializer nor the output of a "
               "QuantizeLinear");
    QdqWeight qw;
    qw.is_unsigned = !w->second.is_signed;
    qw.scales = s;
    const int64_t rank = w->second.bytes.dim();
    qw.axis = d.get_int("axis", 1);
    if (qw.axis < 0) qw.axis += rank;
    DPAR_CHECK(s.size() == 1 || (qw.axis >= 0 && qw.axis < rank &&
                                 static_cast<int64_t>(s.size()) == w->second.bytes.size(qw.axis)),
               g_.path, ": ", d.label(), ": ", s.size(), " scales for axis ", qw.axis,
               " of the weight ", w->second.bytes.shape());
    std::vector<float> v(static_cast<size_t>(w->second.bytes.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = w->second.at(static_cast<int64_t>(i));
    qw.values = Tensor::from_vector(v, w->second.bytes.shape());
    for (const Reader& r : readers(d.outputs[0])) {
      DPAR_CHECK((r.node->op == "Conv" || r.node->op == "Gemm") && r.input == 1, g_.path, ": ",
                 r.node->label(), " reads the dequantized int8 constant of ", d.label(),
                 " as input ", r.input, "; dpar::infer runs int8 weights only in Conv and Gemm");
    }
    out_.weights[d.outputs[0]] = std::move(qw);
  }

  const Graph& g_;
  std::map<std::string, std::vector<Reader>> readers_;
  std::map<std::string, const Node*> producer_;
  Qdq out_;
};

}  // namespace

Qdq resolve_qdq(const Graph& graph) { return QdqResolver(graph).run(); }

}  // namespace dpar::infer::detail
