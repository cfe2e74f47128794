// Validation and lowering of an ONNX graph to detail::Program: the supported-op check (all
// offenders listed at once), dangling-input check, no-op removal (Identity, inference-mode
// Dropout), BatchNormalization folding into the producing Conv/Gemm, and per-node attribute
// checks. Shape checks need the input shape and live in the planner.
#include <cfloat>
#include <cmath>
#include <set>

#include "infer/graph.h"
#include "tensor/cpu/onednn_context.h"

namespace dpar::infer::detail {

const std::set<std::string>& planner_ops() {
  static const std::set<std::string> ops = {"Conv",
                                            "BatchNormalization",
                                            "Gemm",
                                            "Relu",
                                            "LeakyRelu",
                                            "HardSwish",
                                            "HardSigmoid",
                                            "Sigmoid",
                                            "Tanh",
                                            "Clip",
                                            "Add",
                                            "Mul",
                                            "GlobalAveragePool",
                                            "Flatten",
                                            "Softmax",
                                            "Identity",
                                            "Dropout",
                                            "QuantizeLinear",
                                            "DequantizeLinear"};
  return ops;
}

namespace {

std::string join(const std::vector<std::string>& items, size_t limit) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += ", ... (" + std::to_string(items.size() - limit) + " more)";
  return out;
}

class Lowering {
 public:
  explicit Lowering(const Graph& g) : g_(g) {}

  Program run() {
    check_supported();
    check_io();
    check_defined();
    resolve_aliases();
    qdq_ = resolve_qdq(g_);
    prog_.path = g_.path;
    prog_.input = value(g_.inputs[0].name);
    prog_.input_dims = g_.inputs[0].dims;
    for (const Node& node : g_.nodes) {
      // Quantize/dequantize pairs become the int8 data of the Conv/Gemm that reads them.
      if (node.op == "Identity" || node.op == "Dropout" || node.op == "QuantizeLinear" ||
          node.op == "DequantizeLinear") {
        continue;
      }
      try {
        lower(node);
      } catch (const Error& e) {
        throw Error(g_.path + ": " + e.what());
      }
    }
    recombine_hardswish();
    const std::string out = canon(g_.outputs[0]);
    DPAR_CHECK(!is_constant(out), g_.path, ": the graph output '", g_.outputs[0],
               "' is a constant");
    prog_.output = value(out);
    DPAR_CHECK(prog_.output != prog_.input, g_.path,
               ": the graph output is its input; there is nothing to run");
    return std::move(prog_);
  }

 private:
  void check_supported() const {
    // Opsets before 7 gave Gemm, Add and Mul explicit broadcast attributes and BatchNormalization
    // other outputs; the lowerings below follow opset 7 and later.
    DPAR_CHECK(g_.opset >= 7, g_.path, ": opset ", g_.opset,
               " is not supported (dpar::infer reads opset 7 and later)");
    std::vector<std::string> bad;
    for (const Node& n : g_.nodes) {
      if (!planner_ops().count(n.op)) bad.push_back(n.op + " (node '" + n.name + "')");
    }
    DPAR_CHECK(bad.empty(), g_.path, ": unsupported ONNX ops: ", join(bad, 20));
  }

  void check_io() const {
    std::vector<std::string> names;
    for (const auto& in : g_.inputs) names.push_back(in.name);
    DPAR_CHECK(g_.inputs.size() == 1, g_.path, ": expected exactly one graph input, got ",
               g_.inputs.size(), names.empty() ? "" : " (" + join(names, 8) + ")");
    const GraphValue& in = g_.inputs[0];
    DPAR_CHECK(in.elem_type == 0 || in.elem_type == 1, g_.path, ": graph input '", in.name,
               "' has ONNX element type ", in.elem_type, ", expected FLOAT (1)");
    DPAR_CHECK(g_.outputs.size() == 1, g_.path, ": expected exactly one graph output, got ",
               g_.outputs.size(), " (", join(g_.outputs, 8), ")");
  }

  // Every node input must be a graph input, an initializer or an earlier node's output
  // (ONNX requires topological order). Reports all dangling names at once.
  void check_defined() const {
    std::set<std::string> defined = {g_.inputs[0].name};
    for (const auto& [name, t] : g_.initializers) defined.insert(name);
    for (const auto& [name, t] : g_.other_constants) defined.insert(name);
    std::vector<std::string> missing;
    for (const Node& n : g_.nodes) {
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (!n.inputs[k].empty() && !defined.count(n.inputs[k])) {
          missing.push_back("'" + n.inputs[k] + "' (input " + std::to_string(k) + " of " +
                            n.label() + ")");
        }
      }
      for (const std::string& out : n.outputs) defined.insert(out);
    }
    if (!defined.count(g_.outputs[0])) missing.push_back("'" + g_.outputs[0] + "' (graph output)");
    DPAR_CHECK(missing.empty(), g_.path,
               ": missing tensors (no initializer, graph input or earlier node produces them): ",
               join(missing, 20));
  }

  // Identity and Dropout forward their input; count the consumers of every value afterwards
  // (BN folding needs to know that the convolution's output feeds nothing else).
  void resolve_aliases() {
    std::set<std::string> secondary_outputs;  // outputs we never compute (BN stats, masks)
    for (const Node& n : g_.nodes) {
      for (size_t k = 1; k < n.outputs.size(); ++k) {
        if (!n.outputs[k].empty()) secondary_outputs.insert(n.outputs[k]);
      }
      if (n.op == "Identity" || n.op == "Dropout") {
        DPAR_CHECK(!n.inputs.empty() && !n.inputs[0].empty(), g_.path, ": ", n.label(),
                   " has no input");
        if (n.op == "Dropout" && n.inputs.size() > 2 && !n.inputs[2].empty()) {
          auto it = g_.initializers.find(n.inputs[2]);
          DPAR_CHECK(it != g_.initializers.end() && it->second.item() == 0, g_.path, ": ",
                     n.label(), " may run in training mode; only inference Dropout is supported");
        }
        alias_[n.outputs[0]] = canon(n.inputs[0]);
        continue;
      }
      for (const std::string& in : n.inputs) {
        if (!in.empty()) ++consumers_[canon(in)];
      }
    }
    ++consumers_[canon(g_.outputs[0])];
    for (const Node& n : g_.nodes) {
      for (const std::string& in : n.inputs) {
        DPAR_CHECK(!secondary_outputs.count(in), g_.path, ": ", n.label(), " reads '", in,
                   "', a secondary output (training statistics or a mask) that inference does "
                   "not compute");
      }
    }
    DPAR_CHECK(!secondary_outputs.count(g_.outputs[0]), g_.path, ": the graph output '",
               g_.outputs[0], "' is a secondary output that inference does not compute");
  }

  std::string canon(const std::string& name) const {
    auto it = alias_.find(name);
    return it == alias_.end() ? name : it->second;
  }

  bool is_constant(const std::string& name) const {
    return g_.initializers.count(name) || g_.other_constants.count(name);
  }

  int value(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const int id = static_cast<int>(prog_.value_names.size());
    ids_[name] = id;
    prog_.value_names.push_back(name);
    auto init = g_.initializers.find(name);
    prog_.constants.push_back(init == g_.initializers.end() ? Tensor() : init->second);
    return id;
  }

  const std::string& input_name(const Node& n, size_t k, const char* what) const {
    DPAR_CHECK(k < n.inputs.size() && !n.inputs[k].empty(), n.label(), ": missing input ", k, " (",
               what, ")");
    return n.inputs[k];
  }

  // A computed (non-constant) input.
  int activation(const Node& n, size_t k) {
    const std::string name = canon(input_name(n, k, "data"));
    DPAR_CHECK(!is_constant(name), n.label(), ": input ", k, " ('", name,
               "') is a constant; constant folding is not supported");
    return value(name);
  }

  // A float initializer input, optionally of a given rank.
  Tensor constant(const Node& n, size_t k, const char* what, int64_t rank = -1) const {
    const std::string name = canon(input_name(n, k, what));
    auto other = g_.other_constants.find(name);
    DPAR_CHECK(other == g_.other_constants.end(), n.label(), ": ", what, " '", name, "' is ",
               other == g_.other_constants.end() ? "" : other->second, ", expected FLOAT");
    auto it = g_.initializers.find(name);
    DPAR_CHECK(it != g_.initializers.end(), n.label(), ": ", what, " '", name,
               "' must be an initializer (computed ", what, " is not supported)");
    DPAR_CHECK(it->second.dtype() == DType::f32, n.label(), ": ", what, " '", name,
               "' is INT64, expected FLOAT");
    DPAR_CHECK(rank < 0 || it->second.dim() == rank, n.label(), ": ", what, " '", name,
               "' should be ", rank, "-D, got shape ", it->second.shape());
    return it->second;
  }

  Op& emit(OpKind kind, const Node& n, int src, const std::string& dst) {
    Op op;
    op.kind = kind;
    op.nodes.push_back(n.label());
    op.src = src;
    op.dst = value(dst);
    producer_[op.dst] = prog_.ops.size();
    prog_.ops.push_back(std::move(op));
    return prog_.ops.back();
  }

  void lower(const Node& n) {
    const std::string& out = n.outputs.at(0);
    if (n.op == "Conv") return lower_conv(n, out);
    if (n.op == "BatchNormalization") return lower_batch_norm(n, out);
    if (n.op == "Gemm") return lower_gemm(n, out);
    if (n.op == "Add" || n.op == "Mul") return lower_binary(n, out);
    if (n.op == "GlobalAveragePool") {
      emit(OpKind::GlobalAvgPool, n, activation(n, 0), out);
      return;
    }
    if (n.op == "Flatten") {
      emit(OpKind::Flatten, n, activation(n, 0), out).axis = n.get_int("axis", 1);
      return;
    }
    if (n.op == "Softmax") {
      Op& op = emit(OpKind::Softmax, n, activation(n, 0), out);
      op.softmax_coerce_2d = g_.opset < 13;
      op.axis = n.get_int("axis", g_.opset < 13 ? 1 : -1);
      return;
    }
    emit(OpKind::Eltwise, n, activation(n, 0), out).acts = activation_of(n);
  }

  std::vector<Eltwise> activation_of(const Node& n) const {
    using dnnl::algorithm;
    if (n.op == "Relu") return {{algorithm::eltwise_relu, 0.f, 0.f}};
    if (n.op == "LeakyRelu") return {{algorithm::eltwise_relu, n.get_float("alpha", 0.01f), 0.f}};
    if (n.op == "HardSwish") return {{algorithm::eltwise_hardswish, 0.f, 0.f}};
    if (n.op == "Sigmoid") return {{algorithm::eltwise_logistic, 0.f, 0.f}};
    if (n.op == "Tanh") return {{algorithm::eltwise_tanh, 0.f, 0.f}};
    if (n.op == "HardSigmoid") {
      // max(0, min(1, alpha*x + beta)): oneDNN 2.6 has no hardsigmoid, but linear + clip is
      // the same function and both fuse as post-ops.
      return {{algorithm::eltwise_linear, n.get_float("alpha", 0.2f), n.get_float("beta", 0.5f)},
              {algorithm::eltwise_clip, 0.f, 1.f}};
    }
    DPAR_CHECK(n.op == "Clip", "internal: no activation for ", n.label());
    float lo = -FLT_MAX, hi = FLT_MAX;
    if (g_.opset < 11) {
      lo = n.get_float("min", lo);
      hi = n.get_float("max", hi);
    } else {
      if (n.inputs.size() > 1 && !n.inputs[1].empty()) lo = scalar(n, 1, "min");
      if (n.inputs.size() > 2 && !n.inputs[2].empty()) hi = scalar(n, 2, "max");
    }
    return {{algorithm::eltwise_clip, lo, hi}};
  }

  float scalar(const Node& n, size_t k, const char* what) const {
    const Tensor t = constant(n, k, what);
    DPAR_CHECK(t.numel() == 1, n.label(), ": ", what, " should be a scalar, got shape ", t.shape());
    return static_cast<float>(t.item());
  }

  // A Conv/Gemm's data input and its weight (input 1, of rank `rank`), through their
  // Quantize/Dequantize pairs when the node is quantized (qdq.cpp checks both are, or neither).
  struct DataAndWeight {
    int x = -1;
    const QdqActivation* qa = nullptr;
    const QdqWeight* qw = nullptr;
    Tensor w;  // the int8 values as f32 when quantized
  };
  DataAndWeight data_and_weight(const Node& n, const char* what, int64_t rank) {
    DataAndWeight d;
    d.qa = quantized_input(n);
    d.x = d.qa ? quantized_source(n, *d.qa) : activation(n, 0);
    d.qw = d.qa ? &qdq_.weights.at(n.inputs[1]) : nullptr;
    DPAR_CHECK(!d.qw || d.qw->values.dim() == rank, n.label(), ": the int8 ", what, " should be ",
               rank, "-D, got ", d.qw ? d.qw->values.shape() : Shape{});
    d.w = d.qw ? d.qw->values : constant(n, 1, what, rank);
    return d;
  }

  void lower_conv(const Node& n, const std::string& out) {
    const DataAndWeight d = data_and_weight(n, "weight", 4);
    const int x = d.x;
    const QdqActivation* qa = d.qa;
    const QdqWeight* qw = d.qw;
    const Tensor& w = d.w;
    const int64_t o = w.size(0);
    Tensor b;
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      b = constant(n, 2, "bias", 1);
      DPAR_CHECK(b.size(0) == o, n.label(), ": bias has ", b.size(0), " values, weight ", w.shape(),
                 " has ", o, " output channels");
    }
    const auto kernel = n.get_ints("kernel_shape", {w.size(2), w.size(3)});
    DPAR_CHECK(kernel.size() == 2 && kernel[0] == w.size(2) && kernel[1] == w.size(3), n.label(),
               ": kernel_shape ", kernel, " does not match weight ", w.shape());
    const auto strides = n.get_ints("strides", {1, 1});
    const auto dilations = n.get_ints("dilations", {1, 1});
    const auto pads = n.get_ints("pads", {0, 0, 0, 0});
    DPAR_CHECK(strides.size() == 2 && strides[0] >= 1 && strides[1] >= 1, n.label(),
               ": strides should be 2 positive values, got ", strides);
    DPAR_CHECK(dilations.size() == 2 && dilations[0] >= 1 && dilations[1] >= 1, n.label(),
               ": dilations should be 2 positive values, got ", dilations);
    DPAR_CHECK(pads.size() == 4 && pads[0] >= 0 && pads[1] >= 0 && pads[2] >= 0 && pads[3] >= 0,
               n.label(), ": pads should be 4 non-negative values, got ", pads);
    const int64_t groups = n.get_int("group", 1);
    DPAR_CHECK(groups >= 1 && o % groups == 0, n.label(), ": group ", groups,
               " does not divide the ", o, " output channels");
    const std::string auto_pad = n.get_string("auto_pad", "NOTSET");
    DPAR_CHECK(auto_pad == "NOTSET" || auto_pad == "VALID" || auto_pad == "SAME_UPPER" ||
                   auto_pad == "SAME_LOWER",
               n.label(), ": unknown auto_pad '", auto_pad, "'");
    Op& op = emit(OpKind::Conv, n, x, out);
    op.weight = w;
    op.bias = b;
    op.groups = groups;
    op.stride = {strides[0], strides[1]};
    op.dilation = {dilations[0], dilations[1]};
    op.pads = {pads[0], pads[1], pads[2], pads[3]};
    op.auto_pad = auto_pad;
    if (qa) make_int8(op, n, *qa, *qw, 0);
  }

  // The QuantizeLinear -> DequantizeLinear pair on input 0 of a Conv/Gemm, or nullptr.
  const QdqActivation* quantized_input(const Node& n) const {
    if (n.inputs.empty()) return nullptr;
    auto it = qdq_.activations.find(n.inputs[0]);
    return it == qdq_.activations.end() ? nullptr : &it->second;
  }

  int quantized_source(const Node& n, const QdqActivation& qa) {
    const std::string name = canon(qa.x);
    DPAR_CHECK(!is_constant(name), n.label(), ": its quantized input '", name,
               "' is a constant; constant folding is not supported");
    return value(name);
  }

  // op.weight holds the int8 values as f32 (for the shape checks) with weight's output
  // channels along out_axis; converts to s8 bytes [O,...] and pre-divides the bias.
  void make_int8(Op& op, const Node& n, const QdqActivation& qa, const QdqWeight& qw,
                 int64_t out_axis) {
    DPAR_CHECK(!qw.is_unsigned, n.label(),
               ": uint8 weights are not supported (oneDNN's int8 "
               "kernels take int8 weights)");
    DPAR_CHECK(qw.scales.size() == 1 || qw.axis == out_axis, n.label(),
               ": weight scales along axis ", qw.axis, "; only per-output-channel (axis ", out_axis,
               ") or per-tensor scales are supported");
    const int64_t o = op.weight.size(0);
    op.int8.src_scale = qa.scale;
    op.int8.src_unsigned = qa.is_unsigned;
    // Without VNNI, oneDNN 2.6 runs int8 depthwise convolutions on a generic kernel, slower than
    // its f32 depthwise one (MobileNetV3-small under ONEDNN_MAX_CPU_ISA=AVX2, batch 32: its 5x5
    // layers 8.0 ms a run in int8, 4.7 in f32). Such a convolution runs in f32 on its weights
    // dequantized here and on its input quantized and dequantized (an int8 producer writes f32
    // values on the input's grid; otherwise the plan dequantizes the integers a producer wrote,
    // or quantizes and dequantizes an f32 value), so its result is the QDQ model's, as the int8
    // kernel's is.
    const bool depthwise = op.kind == OpKind::Conv && op.groups > 1 && op.weight.size(1) == 1;
    if (depthwise && !cpu::onednn::has_int8_dot_product()) {
      std::vector<float> w = op.weight.to_float_vector();
      const size_t per_channel = w.size() / static_cast<size_t>(o);
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] *= qw.scales.size() == 1 ? qw.scales[0] : qw.scales[i / per_channel];
      }
      op.weight = Tensor::from_vector(w, op.weight.shape());
      op.int8.f32 = true;
      return;
    }
    op.int8.on = true;
    op.int8.w_scales = qw.scales;
    // Without VNNI, oneDNN's int8 kernels add pairs of u8 x s8 products in 16 bits. For s8
    // sources they halve the weights so that those sums stay in range; for u8 sources they do
    // not, and large values saturate: with every input 255 and every weight 127, its 1x1 and 3x3
    // convolutions (and inner product) returned half the exact result. Here those weights are
    // halved instead (rounded half to even, as oneDNN rounds), the bias with them and the scales
    // doubled: an error of at most one weight step per input. With one input channel per group
    // (depthwise) no pairs form, and the kernels are exact.
    const bool one_input_channel = op.kind == OpKind::Conv && op.weight.size(1) == 1;
    op.int8.halved = qa.is_unsigned && !one_input_channel && !cpu::onednn::has_int8_dot_product();
    const float weight_factor = op.int8.halved ? 0.5f : 1.f;
    if (op.int8.halved) {
      for (float& s : op.int8.w_scales) s *= 2;
    }
    const std::vector<float> wv = op.weight.to_float_vector();
    Tensor bytes = Tensor::empty(op.weight.shape(), DType::u8);
    for (size_t i = 0; i < wv.size(); ++i) {
      const float q = std::nearbyint(wv[i] * weight_factor);  // the default mode: half to even
      bytes.data<uint8_t>()[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
    op.weight = bytes;
    std::vector<float> b = op.bias.defined() ? op.bias.to_float_vector()
                                             : std::vector<float>(static_cast<size_t>(o), 0.f);
    for (size_t c = 0; c < b.size(); ++c) {
      b[c] /= qa.scale * op.int8.w_scales[op.int8.w_scales.size() == 1 ? 0 : c];
    }
    op.bias = Tensor::from_vector(b, {o});
  }

  // y = (x - mean) / sqrt(var + eps) * scale + bias = x * s + (bias - mean * s). Folded into
  // the producing Conv/Gemm when that op's output feeds only this node; otherwise it runs as
  // a per-channel 1x1 depthwise convolution, which is exactly a per-channel affine map.
  void lower_batch_norm(const Node& n, const std::string& out) {
    DPAR_CHECK(n.get_int("training_mode", 0) == 0, n.label(),
               ": training_mode=1; only inference BatchNormalization is supported");
    DPAR_CHECK(n.get_int("spatial", 1) == 1, n.label(), ": spatial=0 is not supported");
    const int x = activation(n, 0);
    const Tensor scale = constant(n, 1, "scale", 1);
    const int64_t c = scale.size(0);
    const Tensor bias = constant(n, 2, "bias", 1);
    const Tensor mean = constant(n, 3, "mean", 1);
    const Tensor var = constant(n, 4, "var", 1);
    DPAR_CHECK(bias.size(0) == c && mean.size(0) == c && var.size(0) == c, n.label(),
               ": scale, bias, mean and var should have the same length, got ", scale.shape(),
               bias.shape(), mean.shape(), var.shape());
    const float eps = n.get_float("epsilon", 1e-5f);
    const std::vector<float> sv = scale.to_float_vector(), bv = bias.to_float_vector(),
                             mv = mean.to_float_vector(), vv = var.to_float_vector();
    std::vector<float> mul(static_cast<size_t>(c)), add(static_cast<size_t>(c));
    for (size_t i = 0; i < mul.size(); ++i) {
      DPAR_CHECK(vv[i] + eps > 0, n.label(), ": var + epsilon is not positive for channel ", i);
      mul[i] = sv[i] / std::sqrt(vv[i] + eps);
      add[i] = bv[i] - mv[i] * mul[i];
    }
    auto prod = producer_.find(x);
    const bool foldable = prod != producer_.end() &&
                          (prog_.ops[prod->second].kind == OpKind::Conv ||
                           prog_.ops[prod->second].kind == OpKind::Gemm) &&
                          !prog_.ops[prod->second].int8.on &&
                          consumers_[prog_.value_names[static_cast<size_t>(x)]] == 1;
    if (foldable) {
      // Copied: erasing the producer entry of x below frees the node prod points to.
      const size_t op_index = prod->second;
      Op& op = prog_.ops[op_index];
      DPAR_CHECK(op.weight.size(0) == c, n.label(), ": ", c, " channels, but ", op.nodes[0],
                 " produces ", op.weight.size(0));
      fold_affine(op, mul, add);
      op.nodes.push_back(n.label());
      producer_.erase(op.dst);
      op.dst = value(out);
      producer_[op.dst] = op_index;
      return;
    }
    Op& op = emit(OpKind::Conv, n, x, out);
    op.weight = Tensor::from_vector(mul, {c, 1, 1, 1});
    op.bias = Tensor::from_vector(add, {c});
    op.groups = c;
  }

  // weight rows scaled by mul, bias -> bias * mul + add. New tensors: initializers may be
  // shared between nodes (exporters deduplicate equal constants).
  static void fold_affine(Op& op, const std::vector<float>& mul, const std::vector<float>& add) {
    std::vector<float> w = op.weight.to_float_vector();
    const size_t rows = mul.size(), per_row = w.size() / rows;
    for (size_t r = 0; r < rows; ++r) {
      for (size_t k = 0; k < per_row; ++k) w[r * per_row + k] *= mul[r];
    }
    std::vector<float> b =
        op.bias.defined() ? op.bias.to_float_vector() : std::vector<float>(rows, 0.f);
    for (size_t r = 0; r < rows; ++r) b[r] = b[r] * mul[r] + add[r];
    op.weight = Tensor::from_vector(w, op.weight.shape());
    op.bias = Tensor::from_vector(b, {static_cast<int64_t>(rows)});
  }

  // Y = alpha * A * B' + beta * C with B' = B or B^T; as an inner product with weights [O,K].
  void lower_gemm(const Node& n, const std::string& out) {
    DPAR_CHECK(n.get_int("transA", 0) == 0, n.label(), ": transA=1 is not supported");
    const DataAndWeight d = data_and_weight(n, "B", 2);
    const int a = d.x;
    const QdqActivation* qa = d.qa;
    const QdqWeight* qw = d.qw;
    const Tensor& b = d.w;
    const bool trans_b = n.get_int("transB", 0) != 0;
    const float alpha = n.get_float("alpha", 1.f), beta = n.get_float("beta", 1.f);
    const int64_t o = trans_b ? b.size(0) : b.size(1), k = trans_b ? b.size(1) : b.size(0);
    // int8: alpha goes into the weight scales, the integers stay as they are.
    DPAR_CHECK(!qw || alpha > 0, n.label(), ": int8 Gemm with alpha ", alpha, " <= 0");
    const std::vector<float> bv = b.to_float_vector();
    std::vector<float> w(bv.size());
    for (int64_t i = 0; i < o; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        w[static_cast<size_t>(i * k + j)] =
            (qw ? 1.f : alpha) * bv[static_cast<size_t>(trans_b ? i * k + j : j * o + i)];
      }
    }
    Op& op = emit(OpKind::Gemm, n, a, out);
    op.weight = Tensor::from_vector(w, {o, k});
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const Tensor c = constant(n, 2, "C");
      const std::vector<float> cv = c.to_float_vector();
      DPAR_CHECK(c.numel() == 1 || (c.numel() == o && c.size(-1) == o), n.label(), ": C of shape ",
                 c.shape(), " is not supported (expected [", o, "], [1,", o, "] or a scalar)");
      std::vector<float> bias(static_cast<size_t>(o));
      for (size_t i = 0; i < bias.size(); ++i) bias[i] = beta * cv[cv.size() == 1 ? 0 : i];
      op.bias = Tensor::from_vector(bias, {o});
    }
    if (qw) {
      QdqWeight scaled = *qw;
      for (float& sc : scaled.scales) sc *= alpha;
      make_int8(op, n, *qa, scaled, trans_b ? 0 : 1);
    }
  }

  void lower_binary(const Node& n, const std::string& out) {
    std::string lhs = canon(input_name(n, 0, "A")), rhs = canon(input_name(n, 1, "B"));
    DPAR_CHECK(!(is_constant(lhs) && is_constant(rhs)), n.label(),
               ": both operands are constants; constant folding is not supported");
    if (is_constant(lhs)) std::swap(lhs, rhs);  // Add and Mul commute
    if (is_constant(rhs)) constant(n, lhs == canon(n.inputs[0]) ? 1 : 0, "constant operand");
    Op& op = emit(OpKind::Binary, n, value(lhs), out);
    op.src2 = value(rhs);
    op.binary_alg = n.op == "Add" ? dnnl::algorithm::binary_add : dnnl::algorithm::binary_mul;
  }

  // Exports for opset < 14 spell hardswish as x * HardSigmoid(x) with alpha 1/6, beta 0.5.
  // As one HardSwish it fuses into the convolution before it instead of costing two passes.
  void recombine_hardswish() {
    auto& ops = prog_.ops;
    std::vector<int> uses(prog_.value_names.size(), 0);
    std::map<int, size_t> producer;
    for (size_t i = 0; i < ops.size(); ++i) {
      for (int v : {ops[i].src, ops[i].src2}) {
        if (v >= 0) ++uses[static_cast<size_t>(v)];
      }
      producer[ops[i].dst] = i;
    }
    const std::string out = canon(g_.outputs[0]);
    if (ids_.count(out)) ++uses[static_cast<size_t>(ids_.at(out))];
    auto is_gate = [](const Op& e) {
      return e.kind == OpKind::Eltwise && e.acts.size() == 2 &&
             e.acts[0].alg == dnnl::algorithm::eltwise_linear &&
             std::abs(e.acts[0].alpha - 1.f / 6.f) < 1e-6f && e.acts[0].beta == 0.5f &&
             e.acts[1].alg == dnnl::algorithm::eltwise_clip && e.acts[1].alpha == 0.f &&
             e.acts[1].beta == 1.f;
    };
    std::vector<bool> dead(ops.size(), false);
    for (Op& op : ops) {
      if (op.kind != OpKind::Binary || op.binary_alg != dnnl::algorithm::binary_mul) continue;
      for (const auto& [x, gate] : {std::pair{op.src, op.src2}, std::pair{op.src2, op.src}}) {
        auto it = producer.find(gate);
        if (it == producer.end() || dead[it->second]) continue;
        const Op& e = ops[it->second];
        if (!is_gate(e) || e.src != x || uses[static_cast<size_t>(gate)] != 1) continue;
        op.kind = OpKind::Eltwise;
        op.src = x;
        op.src2 = -1;
        op.acts = {{dnnl::algorithm::eltwise_hardswish, 0.f, 0.f}};
        op.nodes.insert(op.nodes.begin(), e.nodes.begin(), e.nodes.end());
        dead[it->second] = true;
        break;
      }
    }
    size_t kept = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (dead[i]) continue;
      if (kept != i) ops[kept] = std::move(ops[i]);  // never self-move: it would empty the op
      ++kept;
    }
    ops.resize(kept);
  }

  const Graph& g_;
  Qdq qdq_;
  Program prog_;
  std::map<std::string, std::string> alias_;
  std::map<std::string, int> consumers_;
  std::map<std::string, int> ids_;
  std::map<int, size_t> producer_;  // value id -> index of the op computing it
};

}  // namespace

Program lower(const Graph& graph) { return Lowering(graph).run(); }

}  // namespace dpar::infer::detail
