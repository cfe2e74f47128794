// dpar::infer's node-by-node path (see graph_interpreter.h).
#include "infer/graph_interpreter.h"

#include <algorithm>
#include <cmath>

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"

namespace dpar::infer::detail {

const std::map<std::string, size_t>& interpreter_ops() {
  // Each op with the number of leading inputs it reads unconditionally (eval indexes them
  // without a check); inputs after these are optional (a bias, a pad value).
  // clang-format off
  static const std::map<std::string, size_t> ops = {
      {"Conv", 2},      {"Gemm", 2},        {"MatMul", 2},
      {"Add", 2},       {"Sub", 2},         {"Mul", 2},
      {"Div", 2},       {"Erf", 1},         {"Relu", 1},
      {"LeakyRelu", 1}, {"Sigmoid", 1},     {"Tanh", 1},
      {"Softmax", 1},   {"Flatten", 1},     {"Identity", 1},
      {"Dropout", 1},   {"Reshape", 2},     {"Transpose", 1},
      {"Pad", 2},       {"Gather", 2},      {"Sqrt", 1},
      {"MaxPool", 1},   {"AveragePool", 1}, {"GlobalAveragePool", 1},
      {"HardSwish", 1}, {"HardSigmoid", 1}, {"LayerNormalization", 2},
      {"Concat", 1},    {"BatchNormalization", 5}};
  // clang-format on
  return ops;
}

namespace {

std::vector<int64_t> ints_of(const Tensor& t) { return t.to(Device::cpu()).to_int_vector(); }

// The constant (initializer) input i of node, or a dpar::Error naming the node.
const Tensor& constant_input(const Node& n, size_t i,
                             const std::map<std::string, Tensor>& constants, const char* what) {
  DPAR_CHECK(i < n.inputs.size() && constants.count(n.inputs[i]), n.label(), ": its ", what,
             " (input ", i, ") must be a constant initializer");
  return constants.at(n.inputs[i]);
}

Tensor softmax_last(const Tensor& x, int64_t axis) {
  return softmax(x, axis < 0 ? axis + x.dim() : axis);
}

}  // namespace

GraphInterpreter::GraphInterpreter(const Graph& g) : path_(g.path), nodes_(g.nodes) {
  std::vector<std::string> unsupported;
  for (const Node& n : g.nodes) {
    if (!interpreter_ops().count(n.op)) unsupported.push_back(n.label());
  }
  if (!unsupported.empty()) {
    std::string list;
    for (size_t i = 0; i < unsupported.size() && i < 8; ++i)
      list += (i ? ", " : "") + unsupported[i];
    DPAR_FAIL(g.path, ": unsupported op(s) ", list, unsupported.size() > 8 ? ", ..." : "",
              "; dpar::infer runs ", interpreter_ops().size(), " ops (see dpar/infer/runtime.h)");
  }
  DPAR_CHECK(g.inputs.size() == 1 && g.outputs.size() == 1, g.path,
             ": expected one input and one output");
  input_ = g.inputs[0].name;
  output_ = g.outputs[0];
  for (const auto& [name, t] : g.initializers) constants_[name] = t;
  // Every input must come from the graph input, an initializer or an earlier node.
  std::set<std::string> known{input_};
  for (const auto& [name, t] : constants_) known.insert(name);
  std::vector<std::string> missing;
  for (const Node& n : nodes_) {
    const size_t required = interpreter_ops().at(n.op);
    DPAR_CHECK(n.inputs.size() >= required, g.path, ": ", n.label(), " needs ", required,
               " inputs, the file gives ", n.inputs.size());
    for (size_t i = 0; i < required; ++i) {
      DPAR_CHECK(!n.inputs[i].empty(), g.path, ": ", n.label(), " leaves its required input ", i,
                 " empty");
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!n.inputs[i].empty() && !known.count(n.inputs[i])) {
        missing.push_back("'" + n.inputs[i] + "' (input " + std::to_string(i) + " of " + n.label() +
                          ")");
      }
    }
    for (const std::string& out : n.outputs) known.insert(out);
  }
  DPAR_CHECK(known.count(output_), g.path, ": the graph output '", output_,
             "' is not produced by any node, initializer or input");
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
    DPAR_FAIL(g.path, ": missing tensors ", list, missing.size() > 8 ? ", ..." : "");
  }
  for (const Node& n : nodes_) {
    if (n.op == "Reshape") constant_input(n, 1, constants_, "shape");
    if (n.op == "Pad") {
      constant_input(n, 1, constants_, "pads");
      DPAR_CHECK(n.get_string("mode", "constant") == "constant", n.label(),
                 ": only constant padding is supported");
      const bool zero_value =
          n.inputs.size() < 3 || n.inputs[2].empty() ||
          (constants_.count(n.inputs[2]) &&
           constants_.at(n.inputs[2]).to_float_vector() == std::vector<float>{0.f});
      DPAR_CHECK(zero_value, n.label(), ": only zero padding is supported");
    }
    if (n.op == "Gather") constant_input(n, 1, constants_, "indices");
    if (n.op == "Conv") {
      const auto pads = n.get_ints("pads", {0, 0, 0, 0});
      DPAR_CHECK(pads.size() == 4 && pads[0] == pads[2] && pads[1] == pads[3], n.label(),
                 ": asymmetric padding is not supported");
      DPAR_CHECK(n.get_string("auto_pad", "NOTSET") == "NOTSET", n.label(),
                 ": auto_pad is not supported");
    }
    if (n.op == "Gemm") {
      DPAR_CHECK(n.get_int("transA", 0) == 0 && n.get_float("alpha", 1.f) == 1.f &&
                     n.get_float("beta", 1.f) == 1.f,
                 n.label(), ": only Gemm with transA 0, alpha 1, beta 1 is supported");
    }
  }
}

void GraphInterpreter::to(Device device) {
  for (auto& [name, t] : constants_) t = t.to(device);
  device_ = device;
}

bool GraphInterpreter::ends_in_softmax() const {
  for (const Node& n : nodes_) {
    if (!n.outputs.empty() && n.outputs[0] == output_) return n.op == "Softmax";
  }
  return false;
}

std::vector<std::string> GraphInterpreter::summary() const {
  std::vector<std::string> lines;
  for (const Node& n : nodes_) lines.push_back("interpreted: " + n.label());
  return lines;
}

Tensor GraphInterpreter::run(const Tensor& input) const {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> values;
  values[input_] = input.to(device_);
  for (const Node& n : nodes_) {
    std::vector<Tensor> in;
    for (const std::string& name : n.inputs) {
      if (name.empty()) {
        in.emplace_back();
        continue;
      }
      auto v = values.find(name);
      if (v != values.end()) {
        in.push_back(v->second);
        continue;
      }
      auto c = constants_.find(name);
      DPAR_CHECK(c != constants_.end(), path_, ": ", n.label(), " reads '", name,
                 "', which no node or initializer produces");
      in.push_back(c->second);
    }
    try {
      values[n.outputs[0]] = eval(n, in);
    } catch (const Error& e) {
      DPAR_FAIL(path_, ": ", n.label(), ": ", e.what());
    }
  }
  auto out = values.find(output_);
  if (out != values.end()) return out->second.contiguous();
  auto c = constants_.find(output_);
  DPAR_CHECK(c != constants_.end(), path_, ": the graph output '", output_, "' was not computed");
  return c->second.contiguous();
}

Tensor GraphInterpreter::eval(const Node& n, const std::vector<Tensor>& in) const {
  const std::string& op = n.op;
  if (op == "Identity" || op == "Dropout") return in[0];
  if (op == "Add") return add(in[0], in[1]);
  if (op == "Sub") return sub(in[0], in[1]);
  if (op == "Mul") return mul(in[0], in[1]);
  if (op == "Div") return div(in[0], in[1]);
  if (op == "Erf") return erf(in[0]);
  if (op == "Sqrt") return sqrt(in[0]);
  if (op == "Relu") return relu(in[0]);
  if (op == "LeakyRelu") return leaky_relu(in[0], n.get_float("alpha", 0.01f));
  if (op == "Sigmoid") return sigmoid(in[0]);
  if (op == "Tanh") return dpar::tanh(in[0]);
  if (op == "HardSwish") return hardswish(in[0]);
  if (op == "HardSigmoid") {
    const float alpha = n.get_float("alpha", 0.2f), beta = n.get_float("beta", 0.5f);
    return clamp(add(mul(in[0], alpha), beta), 0.0, 1.0);
  }
  if (op == "MatMul") return matmul(in[0], in[1]);
  if (op == "Gemm") {
    const Tensor w = n.get_int("transB", 0) ? in[1] : in[1].transpose(0, 1);
    return linear(in[0], w, in.size() > 2 ? in[2] : Tensor());
  }
  if (op == "Softmax") return softmax_last(in[0], n.get_int("axis", -1));
  if (op == "Flatten") return in[0].flatten(n.get_int("axis", 1) == 0 ? 0 : n.get_int("axis", 1));
  if (op == "GlobalAveragePool") return global_avg_pool2d(in[0]);
  if (op == "LayerNormalization") {
    const int64_t axis = n.get_int("axis", -1);
    const int64_t first = axis < 0 ? axis + in[0].dim() : axis;
    DPAR_CHECK(first >= 0 && first < in[0].dim(), "axis ", axis, " is outside a rank-", in[0].dim(),
               " input");
    const Shape normalized(in[0].shape().begin() + first, in[0].shape().end());
    return layer_norm(in[0], normalized, in[1], in.size() > 2 ? in[2] : Tensor(),
                      n.get_float("epsilon", 1e-5f));
  }
  if (op == "BatchNormalization") {
    // Inference form (running statistics), channels at dim 1 of a rank-2+ input: a BatchNorm
    // no Conv absorbed (BatchNorm1d, or one after a Linear).
    DPAR_CHECK(n.get_int("training_mode", 0) == 0,
               "training_mode=1 is not run here (inference only)");
    DPAR_CHECK(in[0].dim() >= 2, "needs a rank-2+ input here, got ", in[0].shape());
    return batch_norm(in[0], in[1], in[2], in[3], in[4], /*training=*/false, 0.0,
                      n.get_float("epsilon", 1e-5f));
  }
  if (op == "Concat") {
    // Every input, along `axis` (required; negative counts from the end). cat checks that the
    // other dims agree and names the shapes when they do not.
    for (const Tensor& t : in) DPAR_CHECK(t.defined(), "Concat: an input is empty");
    const int64_t rank = in[0].dim();
    DPAR_CHECK(n.has("axis"), "the required attribute axis is missing");
    const int64_t axis = n.get_int("axis", 0);
    DPAR_CHECK(axis >= -rank && axis < rank, "axis ", axis, " is outside a rank-", rank, " input");
    return cat(in, axis < 0 ? axis + rank : axis);
  }
  if (op == "Reshape") {
    Shape shape = ints_of(in[1]);
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0) shape[d] = in[0].size(static_cast<int64_t>(d));  // 0: keep (allowzero 0)
      // Bounded before any product is formed: a file's shape must not overflow the count.
      DPAR_CHECK(shape[d] >= -1 && shape[d] <= std::max<int64_t>(1, in[0].numel()), "shape ", shape,
                 " does not fit an input of ", in[0].numel(), " elements");
    }
    return in[0].reshape(shape);
  }
  if (op == "Transpose") {
    Shape perm = n.get_ints("perm", {});
    if (perm.empty()) {
      for (int64_t d = in[0].dim() - 1; d >= 0; --d) perm.push_back(d);
    }
    return in[0].permute(perm);
  }
  if (op == "Gather") {
    const int64_t axis = n.get_int("axis", 0);
    const Tensor idx = in[1].to(device_);
    if (idx.dim() == 0) {
      int64_t i = ints_of(idx)[0];
      if (i < 0) i += in[0].size(axis);
      return in[0].select(axis, i);
    }
    return index_select(in[0], axis, idx.reshape({idx.numel()}));
  }
  if (op == "Pad") {
    const std::vector<int64_t> pads = ints_of(in[1]);
    const int64_t r = in[0].dim();
    DPAR_CHECK(static_cast<int64_t>(pads.size()) == 2 * r, "pads has ", pads.size(),
               " values for a rank-", r, " input");
    Tensor x = in[0];
    for (int64_t d = 0; d < r; ++d) {
      const int64_t before = pads[static_cast<size_t>(d)], after = pads[static_cast<size_t>(d + r)];
      DPAR_CHECK(before >= 0 && after >= 0, "negative pads are not supported");
      // A file's pads must not make the interpreter allocate without bound.
      constexpr int64_t kMaxPadded = int64_t{1} << 28;
      DPAR_CHECK(before <= kMaxPadded && after <= kMaxPadded &&
                     (x.numel() / std::max<int64_t>(1, x.size(d))) * (x.size(d) + before + after) <=
                         kMaxPadded,
                 "pads ", before, "/", after, " on dim ", d, " of ", x.shape(),
                 " give more than 2^28 elements");
      if (before == 0 && after == 0) continue;
      std::vector<Tensor> parts;
      Shape zs = x.shape();
      if (before > 0) {
        zs[static_cast<size_t>(d)] = before;
        parts.push_back(Tensor::zeros(zs, DType::f32, x.device()));
      }
      parts.push_back(x);
      if (after > 0) {
        zs[static_cast<size_t>(d)] = after;
        parts.push_back(Tensor::zeros(zs, DType::f32, x.device()));
      }
      x = cat(parts, d);
    }
    return x;
  }
  if (op == "Conv") {
    const auto strides = n.get_ints("strides", {1, 1});
    const auto pads = n.get_ints("pads", {0, 0, 0, 0});
    const auto dil = n.get_ints("dilations", {1, 1});
    DPAR_CHECK(strides.size() == 2 && dil.size() == 2 && pads.size() == 4,
               "2-D convolution attributes expected (strides, dilations: 2 values; pads: 4)");
    Conv2dOptions o;
    o.stride = {strides[0], strides[1]};
    o.padding = {pads[0], pads[1]};
    o.dilation = {dil[0], dil[1]};
    o.groups = n.get_int("group", 1);
    return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), o);
  }
  if (op == "MaxPool" || op == "AveragePool") {
    const auto k = n.get_ints("kernel_shape", {});
    const auto s = n.get_ints("strides", k);
    const auto p = n.get_ints("pads", {0, 0, 0, 0});
    DPAR_CHECK(k.size() == 2 && s.size() == 2 && p.size() == 4 && p[0] == p[2] && p[1] == p[3],
               "2-D pooling with symmetric padding only");
    const bool ceil = n.get_int("ceil_mode", 0) != 0;
    if (op == "MaxPool") return max_pool2d(in[0], {k[0], k[1]}, {s[0], s[1]}, {p[0], p[1]}, ceil);
    return avg_pool2d(in[0], {k[0], k[1]}, {s[0], s[1]}, {p[0], p[1]}, ceil,
                      n.get_int("count_include_pad", 0) != 0);
  }
  DPAR_FAIL("internal: no interpreter case for ", op);
}

}  // namespace dpar::infer::detail
