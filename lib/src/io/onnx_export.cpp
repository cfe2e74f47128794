// Module tree -> OnnxGraph: the builder, the lowering table with dpar::nn's layers, and the
// BatchNorm-folding pass. Serialization to ONNX protobuf is in onnx_export_write.cpp.
#include "dpar/io/onnx_export.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dpar/core/error.h"
#include "dpar/nn/layers.h"

namespace dpar::io {

namespace {

// An independent contiguous f32 CPU copy: later training steps must not change an export.
Tensor f32_copy(const Tensor& t) { return Tensor::from_vector(t.to_float_vector(), t.shape()); }

std::string join_path(const std::string& parent, const std::string& child) {
  if (parent.empty()) return child;
  if (child.empty()) return parent;
  return parent + "." + child;
}

// ---- built-in lowerings for dpar::nn -----------------------------------------------------
std::string lower_sequential(const nn::Module& m, const std::string& input, OnnxGraphBuilder& b) {
  std::string x = input;
  for (const auto& [name, child] : m.named_children()) x = b.lower(*child, name, x);
  return x;
}

std::string lower_conv(const nn::Module& m, const std::string& input, OnnxGraphBuilder& b) {
  const auto& conv = static_cast<const nn::Conv2d&>(m);
  std::vector<std::string> inputs{input, b.add_initializer("weight", conv.weight)};
  if (conv.bias.defined()) inputs.push_back(b.add_initializer("bias", conv.bias));
  const int64_t k = conv.kernel_size, s = conv.stride, p = conv.padding, d = conv.dilation;
  return b.add_node("Conv", std::move(inputs),
                    {{"dilations", std::vector<int64_t>{d, d}},
                     {"group", conv.groups},
                     {"kernel_shape", std::vector<int64_t>{k, k}},
                     {"pads", std::vector<int64_t>{p, p, p, p}},
                     {"strides", std::vector<int64_t>{s, s}}});
}

std::string lower_batch_norm(const nn::Module& m, const std::string& input, OnnxGraphBuilder& b) {
  const auto& bn = static_cast<const nn::BatchNorm2d&>(m);
  const Shape c{bn.num_features};
  // Without affine parameters the scale is 1 and the shift 0, which ONNX needs spelled out.
  const Tensor gamma = bn.weight.defined() ? bn.weight : Tensor::ones(c);
  const Tensor beta = bn.bias.defined() ? bn.bias : Tensor::zeros(c);
  DPAR_CHECK(bn.running_mean.defined() && bn.running_var.defined(), "export_onnx: ", m.type_name(),
             " at '", b.display_path(), "' has no running statistics to export");
  return b.add_node("BatchNormalization",
                    {input, b.add_initializer("weight", gamma), b.add_initializer("bias", beta),
                     b.add_initializer("running_mean", bn.running_mean),
                     b.add_initializer("running_var", bn.running_var)},
                    {{"epsilon", static_cast<float>(bn.eps)}});
}

std::string lower_linear(const nn::Module& m, const std::string& input, OnnxGraphBuilder& b) {
  const auto& fc = static_cast<const nn::Linear&>(m);
  std::vector<std::string> inputs{input, b.add_initializer("weight", fc.weight)};
  if (fc.bias.defined()) inputs.push_back(b.add_initializer("bias", fc.bias));
  // Gemm computes x * W^T (+ b) for 2-D x: torch's Linear with its [out, in] weight as is.
  return b.add_node("Gemm", std::move(inputs),
                    {{"alpha", 1.0f}, {"beta", 1.0f}, {"transB", int64_t{1}}});
}

std::string lower_flatten(const nn::Module& m, const std::string& input, OnnxGraphBuilder& b) {
  const auto& f = static_cast<const nn::Flatten&>(m);
  // ONNX Flatten always makes a 2-D result [d0*..*d(axis-1), rest]; torch's flatten(s, -1) is
  // the same only for start_dim 1 (batch kept).
  DPAR_CHECK(f.start_dim == 1 && f.end_dim == -1, "export_onnx: Flatten at '", b.display_path(),
             "' with start_dim ", f.start_dim, ", end_dim ", f.end_dim,
             " is not supported (only start_dim 1, end_dim -1)");
  return b.add_node("Flatten", {input}, {{"axis", int64_t{1}}});
}

std::string lower_identity(const nn::Module&, const std::string& input, OnnxGraphBuilder&) {
  return input;  // Dropout and Identity: nothing to compute at inference time
}

}  // namespace

// ---- OnnxNode / OnnxGraph ------------------------------------------------------------------
const OnnxAttribute* OnnxNode::attribute(const std::string& attr_name) const {
  for (const auto& [key, value] : attributes) {
    if (key == attr_name) return &value;
  }
  return nullptr;
}

const Tensor* OnnxGraph::initializer(const std::string& name) const {
  for (const auto& [key, value] : initializers) {
    if (key == name) return &value;
  }
  return nullptr;
}

std::vector<const OnnxNode*> OnnxGraph::consumers(const std::string& value) const {
  std::vector<const OnnxNode*> out;
  for (const OnnxNode& n : nodes) {
    if (std::find(n.inputs.begin(), n.inputs.end(), value) != n.inputs.end()) out.push_back(&n);
  }
  return out;
}

// ---- OnnxGraphBuilder ----------------------------------------------------------------------
OnnxGraphBuilder::OnnxGraphBuilder(OnnxGraph& graph, const OnnxLowerings& lowerings)
    : graph_(graph), lowerings_(lowerings) {
  used_names_[graph_.input] = 1;
  for (const auto& [name, t] : graph_.initializers) used_names_[name] = 1;
  for (const OnnxNode& n : graph_.nodes) used_names_[n.output] = 1;
}

std::string OnnxGraphBuilder::unique_value_name(const std::string& base) {
  int& count = used_names_[base];
  if (count++ == 0) return base;
  for (;;) {  // base_1, base_2, ... skipping names taken on their own
    std::string candidate = base + "_" + std::to_string(count - 1);
    int& taken = used_names_[candidate];
    if (taken++ == 0) return candidate;
    ++count;
  }
}

std::string OnnxGraphBuilder::lower(const nn::Module& child, const std::string& name,
                                    const std::string& input) {
  const std::string saved = path_;
  path_ = join_path(saved, name);
  std::string out;
  try {
    out = lower_here(child, input);
  } catch (...) {
    path_ = saved;
    throw;
  }
  path_ = saved;
  return out;
}

std::string OnnxGraphBuilder::lower_here(const nn::Module& module, const std::string& input) {
  const OnnxLowerings::Lowering* fn = lowerings_.find(module);
  DPAR_CHECK(fn != nullptr, "export_onnx: no ONNX lowering for module '", display_path(),
             "' of type ", module.type_name(), " (register one with OnnxLowerings::add)");
  return (*fn)(module, input, *this);
}

std::string OnnxGraphBuilder::add_node(const std::string& op_type, std::vector<std::string> inputs,
                                       OnnxAttributes attributes) {
  for (const std::string& in : inputs) {
    DPAR_CHECK(used_names_.count(in) != 0, "export_onnx: node ", op_type, " at '", display_path(),
               "' reads unknown value '", in, "'");
  }
  OnnxNode node;
  node.op_type = op_type;
  node.name = unique_value_name(path_.empty() ? op_type : path_ + "/" + op_type);
  node.output = node.name;
  node.inputs = std::move(inputs);
  node.attributes = std::move(attributes);
  graph_.nodes.push_back(std::move(node));
  return graph_.nodes.back().output;
}

std::string OnnxGraphBuilder::add_initializer(const std::string& name, const Tensor& value) {
  DPAR_CHECK(value.defined(), "export_onnx: constant '", join_path(path_, name),
             "' is an undefined tensor");
  const std::string full = unique_value_name(join_path(path_, name));
  graph_.initializers.emplace_back(full, f32_copy(value));
  return full;
}

std::string OnnxGraphBuilder::add_int64_initializer(const std::string& name,
                                                    std::vector<int64_t> values,
                                                    const Shape& shape) {
  const std::string full = unique_value_name(join_path(path_, name));
  DPAR_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), "export_onnx: constant '",
             full, "' has ", values.size(), " values for shape ", shape);
  graph_.initializers.emplace_back(full, Tensor::from_vector(values, shape));
  return full;
}

// ---- OnnxLowerings ---------------------------------------------------------------------------
OnnxLowerings::OnnxLowerings() {
  // Registered most general first: find() searches from the back.
  add<nn::Sequential>(lower_sequential);
  add<nn::Conv2d>(lower_conv);
  add<nn::BatchNorm2d>(lower_batch_norm);
  add<nn::Linear>(lower_linear);
  add<nn::ReLU>([](const nn::Module&, const std::string& x, OnnxGraphBuilder& b) {
    return b.add_node("Relu", {x});
  });
  add<nn::Hardswish>([](const nn::Module&, const std::string& x, OnnxGraphBuilder& b) {
    return b.add_node("HardSwish", {x});
  });
  add<nn::Hardsigmoid>([](const nn::Module&, const std::string& x, OnnxGraphBuilder& b) {
    // torch: relu6(x + 3) / 6 = clip(x / 6 + 1/2, 0, 1); ONNX's default alpha is 0.2.
    return b.add_node("HardSigmoid", {x},
                      {{"alpha", static_cast<float>(1.0 / 6.0)}, {"beta", 0.5f}});
  });
  add<nn::AdaptiveAvgPool2d>([](const nn::Module& m, const std::string& x, OnnxGraphBuilder& b) {
    // ONNX has no adaptive pooling; only the global form has an op whose windows do not
    // depend on the input size.
    const auto& pool = static_cast<const nn::AdaptiveAvgPool2d&>(m);
    DPAR_CHECK(pool.output_height == 1 && pool.output_width == 1, "export_onnx: ", b.display_path(),
               ": AdaptiveAvgPool2d(", pool.output_height, ", ", pool.output_width,
               ") has no ONNX op (only output size 1, GlobalAveragePool); use AvgPool2d with "
               "the window your input size gives, or register a lowering");
    return b.add_node("GlobalAveragePool", {x});
  });
  add<nn::Flatten>(lower_flatten);
  add<nn::Dropout>(lower_identity);
  add<nn::Identity>(lower_identity);
  add_sequence_model_lowerings(*this);
}

void OnnxLowerings::add_matching(Matcher matches, Lowering fn) {
  DPAR_CHECK(matches && fn, "OnnxLowerings::add: empty matcher or lowering");
  entries_.emplace_back(std::move(matches), std::move(fn));
}

const OnnxLowerings::Lowering* OnnxLowerings::find(const nn::Module& module) const {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->first(module)) return &it->second;
  }
  return nullptr;
}

// ---- lowering the tree -----------------------------------------------------------------------
OnnxGraph lower_to_onnx(const nn::Module& module, const OnnxExportOptions& options,
                        const OnnxLowerings& lowerings) {
  DPAR_CHECK(!options.input_name.empty(), "export_onnx: the input name must not be empty");
  OnnxGraph graph;
  graph.input = options.input_name;
  OnnxGraphBuilder builder(graph, lowerings);
  graph.output = builder.lower_here(module, graph.input);
  DPAR_CHECK(graph.output != graph.input, "export_onnx: ", module.type_name(),
             " lowers to no computation (its output is its input)");
  return graph;
}

// ---- BatchNorm folding -----------------------------------------------------------------------
namespace {

int64_t uses_of(const OnnxGraph& g, const std::string& value) {
  int64_t n = 0;
  for (const OnnxNode& node : g.nodes) {
    n += std::count(node.inputs.begin(), node.inputs.end(), value);
  }
  return n + (g.output == value ? 1 : 0);
}

Tensor* mutable_initializer(OnnxGraph& g, const std::string& name) {
  for (auto& [key, value] : g.initializers) {
    if (key == name) return &value;
  }
  return nullptr;
}

// Folds bn (fed by conv) into conv's constants; false when the pattern does not allow it.
bool fold_one(OnnxGraph& g, OnnxNode& conv, const OnnxNode& bn) {
  if (bn.inputs.size() != 5 || conv.inputs.size() < 2) return false;
  if (uses_of(g, conv.output) != 1) return false;  // someone else reads the unnormalised conv
  for (size_t i = 1; i < conv.inputs.size(); ++i) {
    if (g.initializer(conv.inputs[i]) == nullptr || uses_of(g, conv.inputs[i]) != 1) return false;
  }
  std::vector<std::vector<float>> stats;  // gamma, beta, mean, var
  for (size_t i = 1; i < 5; ++i) {
    const Tensor* t = g.initializer(bn.inputs[i]);
    if (t == nullptr) return false;
    stats.push_back(t->to_float_vector());
  }
  const Tensor& w = *g.initializer(conv.inputs[1]);
  const int64_t out_channels = w.size(0);
  for (const auto& s : stats) {
    if (static_cast<int64_t>(s.size()) != out_channels) return false;
  }
  double eps = 1e-5;  // ONNX's default
  if (const OnnxAttribute* a = bn.attribute("epsilon")) eps = std::get<float>(*a);

  std::vector<float> weight = w.to_float_vector();
  std::vector<float> bias(static_cast<size_t>(out_channels), 0.0f);
  if (conv.inputs.size() > 2) bias = g.initializer(conv.inputs[2])->to_float_vector();
  const size_t per_channel = weight.size() / static_cast<size_t>(out_channels);
  for (size_t o = 0; o < static_cast<size_t>(out_channels); ++o) {
    const double scale =
        static_cast<double>(stats[0][o]) / std::sqrt(static_cast<double>(stats[3][o]) + eps);
    for (size_t i = 0; i < per_channel; ++i) {
      float& v = weight[o * per_channel + i];
      v = static_cast<float>(static_cast<double>(v) * scale);
    }
    bias[o] = static_cast<float>((static_cast<double>(bias[o]) - stats[2][o]) * scale +
                                 static_cast<double>(stats[1][o]));
  }
  *mutable_initializer(g, conv.inputs[1]) = Tensor::from_vector(weight, w.shape());
  const Tensor folded_bias = Tensor::from_vector(bias, {out_channels});
  if (conv.inputs.size() > 2) {
    *mutable_initializer(g, conv.inputs[2]) = folded_bias;
  } else {
    // The conv had no bias: it gets one named like its weight ("features.0.0.bias").
    const std::string& wname = conv.inputs[1];
    std::string name = wname.size() > 7 && wname.ends_with(".weight")
                           ? wname.substr(0, wname.size() - 7) + ".bias"
                           : wname + "_bias";
    while (g.initializer(name) != nullptr || uses_of(g, name) != 0) name += "_";
    g.initializers.emplace_back(name, folded_bias);
    conv.inputs.push_back(name);
  }
  conv.output = bn.output;  // the conv now produces what the BN produced
  return true;
}

}  // namespace

int64_t fold_batch_norms(OnnxGraph& graph) {
  int64_t folded = 0;
  std::set<std::string> removed;  // names of folded BN nodes
  for (OnnxNode& bn : graph.nodes) {
    if (bn.op_type != "BatchNormalization" || bn.inputs.empty()) continue;
    for (OnnxNode& conv : graph.nodes) {
      if (&conv == &bn || conv.output != bn.inputs[0]) continue;
      if (conv.op_type == "Conv" && fold_one(graph, conv, bn)) {
        removed.insert(bn.name);
        ++folded;
      }
      break;
    }
  }
  std::erase_if(graph.nodes, [&](const OnnxNode& n) { return removed.count(n.name) != 0; });
  // Drop constants that only the folded BNs read.
  std::erase_if(graph.initializers,
                [&](const auto& entry) { return uses_of(graph, entry.first) == 0; });
  return folded;
}

}  // namespace dpar::io
