// ONNX lowerings for the layers beyond the CNN set: LayerNorm (opset 17 LayerNormalization),
// GELU (its erf or tanh formula in ONNX ops: Gelu itself is opset 20), Tanh, Sigmoid, SiLU,
// LeakyReLU, MaxPool2d, AvgPool2d, self-attention (MultiheadAttention, batch- or
// sequence-first) and TransformerEncoderLayer, plus the Linear-as-MatMul form for inputs of
// any rank.
#include <cmath>

#include "dpar/io/onnx_export.h"
#include "dpar/nn/activation.h"
#include "dpar/nn/pooling.h"
#include "dpar/nn/transformer.h"

namespace dpar::io {

std::string lower_linear_matmul(const nn::Linear& fc, const std::string& name,
                                const std::string& input, OnnxGraphBuilder& b) {
  // MatMul with W^T broadcasts over any leading dims, which Gemm (2-D only) does not.
  const std::string y = b.add_node(
      "MatMul", {input, b.add_initializer(name + ".weight_t", fc.weight.transpose(0, 1))});
  if (!fc.bias.defined()) return y;
  return b.add_node("Add", {y, b.add_initializer(name + ".bias", fc.bias)});
}

namespace {

std::string scalar(OnnxGraphBuilder& b, const std::string& name, double value) {
  return b.add_initializer(name, Tensor::full({}, value));
}

std::string lower_layer_norm(const nn::Module& m, const std::string& x, OnnxGraphBuilder& b) {
  const auto& ln = static_cast<const nn::LayerNorm&>(m);
  DPAR_CHECK(ln.weight.defined(), "export_onnx: ", b.display_path(),
             ": LayerNorm without elementwise_affine is not exported (ONNX's "
             "LayerNormalization needs a scale)");
  return b.add_node("LayerNormalization",
                    {x, b.add_initializer("weight", ln.weight), b.add_initializer("bias", ln.bias)},
                    {{"axis", -static_cast<int64_t>(ln.normalized_shape.size())},
                     {"epsilon", static_cast<float>(ln.eps)}});
}

// GELU as its formula (ONNX's Gelu op is opset 20).
std::string gelu_nodes(GeluApproximation approximate, const std::string& x, OnnxGraphBuilder& b) {
  std::string inner;
  if (approximate == GeluApproximation::tanh) {
    // tanh(sqrt(2/pi) (x + 0.044715 x^3))
    const std::string cube = b.add_node("Mul", {b.add_node("Mul", {x, x}), x});
    const std::string sum =
        b.add_node("Add", {x, b.add_node("Mul", {cube, scalar(b, "kappa", 0.044715)})});
    inner = b.add_node(
        "Tanh", {b.add_node("Mul", {sum, scalar(b, "sqrt_2_over_pi", std::sqrt(2.0 / M_PI))})});
  } else {
    inner = b.add_node("Erf", {b.add_node("Div", {x, scalar(b, "sqrt_2", std::sqrt(2.0))})});
  }
  // x * 0.5 * (1 + inner)
  const std::string one_plus = b.add_node("Add", {inner, scalar(b, "one", 1.0)});
  return b.add_node("Mul", {b.add_node("Mul", {x, scalar(b, "half", 0.5)}), one_plus});
}

std::string lower_gelu(const nn::Module& m, const std::string& x, OnnxGraphBuilder& b) {
  return gelu_nodes(static_cast<const nn::GELU&>(m).approximate, x, b);
}

std::string lower_pool(const std::string& op, int64_t k, int64_t s, int64_t p, bool ceil,
                       const std::string& x, OnnxGraphBuilder& b, OnnxAttributes extra = {}) {
  OnnxAttributes a{{"ceil_mode", int64_t{ceil ? 1 : 0}},
                   {"kernel_shape", std::vector<int64_t>{k, k}},
                   {"pads", std::vector<int64_t>{p, p, p, p}},
                   {"strides", std::vector<int64_t>{s, s}}};
  a.insert(a.end(), extra.begin(), extra.end());
  return b.add_node(op, {x}, std::move(a));
}

std::string int64s(OnnxGraphBuilder& b, const std::string& name, std::vector<int64_t> values) {
  const auto n = static_cast<int64_t>(values.size());
  return b.add_int64_initializer(name, std::move(values), {n});
}

// [S, N, E] <-> [N, S, E]
std::string swap_batch_and_sequence(const std::string& x, OnnxGraphBuilder& b) {
  return b.add_node("Transpose", {x}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
}

// Self-attention (the module's forward(x), no masks) on [N, S, E], or on [S, N, E] between two
// Transposes when the module is sequence-first: the packed projection, heads split by
// Reshape/Transpose, softmax(q k^T * scale) v, heads joined, the output projection.
std::string lower_attention(const nn::Module& m, const std::string& input, OnnxGraphBuilder& b) {
  const auto& mha = static_cast<const nn::MultiheadAttention&>(m);
  const std::string x = mha.batch_first ? input : swap_batch_and_sequence(input, b);
  const int64_t e = mha.embed_dim, h = mha.num_heads, d = e / h;
  std::string qkv = b.add_node(
      "MatMul", {x, b.add_initializer("in_proj_weight_t", mha.in_proj_weight.transpose(0, 1))});
  if (mha.in_proj_bias.defined()) {
    qkv = b.add_node("Add", {qkv, b.add_initializer("in_proj_bias", mha.in_proj_bias)});
  }
  // [N, S, 3E] -> [N, S, 3, H, d] -> [3, N, H, S, d]
  const std::string split = b.add_node(
      "Transpose", {b.add_node("Reshape", {qkv, int64s(b, "qkv_shape", {0, 0, 3, h, d})})},
      {{"perm", std::vector<int64_t>{2, 0, 3, 1, 4}}});
  auto part = [&](int64_t i, const char* name) {
    return b.add_node("Gather",
                      {split, b.add_int64_initializer(std::string(name) + "_index", {i}, {})},
                      {{"axis", int64_t{0}}});
  };
  const std::string q = part(0, "q"), k = part(1, "k"), v = part(2, "v");
  const std::string kt = b.add_node("Transpose", {k}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  const std::string scores = b.add_node(
      "Mul",
      {b.add_node("MatMul", {q, kt}), scalar(b, "scale", 1.0 / std::sqrt(static_cast<double>(d)))});
  const std::string probs = b.add_node("Softmax", {scores}, {{"axis", int64_t{-1}}});
  const std::string heads = b.add_node("MatMul", {probs, v});  // [N, H, S, d]
  const std::string joined = b.add_node(
      "Reshape", {b.add_node("Transpose", {heads}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}),
                  int64s(b, "out_shape", {0, 0, e})});
  const std::string out = lower_linear_matmul(*mha.out_proj, "out_proj", joined, b);
  return mha.batch_first ? out : swap_batch_and_sequence(out, b);
}

// torch.nn.TransformerEncoderLayer's forward(src) in eval mode (dropout left out), post-norm
// (x = norm1(x + sa(x)); x = norm2(x + ff(x))) or pre-norm (x = x + sa(norm1(x));
// x = x + ff(norm2(x))), on the layout its attention takes.
std::string lower_encoder_layer(const nn::Module& m, const std::string& x, OnnxGraphBuilder& b) {
  const auto& layer = static_cast<const nn::TransformerEncoderLayer&>(m);
  auto attention = [&](const std::string& in) {
    return b.lower(*layer.self_attn, "self_attn", in);
  };
  auto feed_forward = [&](const std::string& in) {
    std::string h = lower_linear_matmul(*layer.linear1, "linear1", in, b);
    h = layer.options.activation == nn::TransformerActivation::gelu
            ? gelu_nodes(GeluApproximation::none, h, b)
            : b.add_node("Relu", {h});
    return lower_linear_matmul(*layer.linear2, "linear2", h, b);
  };
  if (layer.options.norm_first) {
    const std::string y = b.add_node("Add", {x, attention(b.lower(*layer.norm1, "norm1", x))});
    return b.add_node("Add", {y, feed_forward(b.lower(*layer.norm2, "norm2", y))});
  }
  const std::string y = b.lower(*layer.norm1, "norm1", b.add_node("Add", {x, attention(x)}));
  return b.lower(*layer.norm2, "norm2", b.add_node("Add", {y, feed_forward(y)}));
}

}  // namespace

void add_sequence_model_lowerings(OnnxLowerings& l) {
  l.add<nn::LayerNorm>(lower_layer_norm);
  l.add<nn::GELU>(lower_gelu);
  l.add<nn::Tanh>([](const nn::Module&, const std::string& x, OnnxGraphBuilder& b) {
    return b.add_node("Tanh", {x});
  });
  l.add<nn::Sigmoid>([](const nn::Module&, const std::string& x, OnnxGraphBuilder& b) {
    return b.add_node("Sigmoid", {x});
  });
  l.add<nn::SiLU>([](const nn::Module&, const std::string& x, OnnxGraphBuilder& b) {
    return b.add_node("Mul", {x, b.add_node("Sigmoid", {x})});
  });
  l.add<nn::LeakyReLU>([](const nn::Module& m, const std::string& x, OnnxGraphBuilder& b) {
    const auto& r = static_cast<const nn::LeakyReLU&>(m);
    return b.add_node("LeakyRelu", {x}, {{"alpha", static_cast<float>(r.negative_slope)}});
  });
  l.add<nn::MaxPool2d>([](const nn::Module& m, const std::string& x, OnnxGraphBuilder& b) {
    const auto& p = static_cast<const nn::MaxPool2d&>(m);
    return lower_pool("MaxPool", p.kernel_size, p.stride, p.padding, p.ceil_mode, x, b);
  });
  l.add<nn::AvgPool2d>([](const nn::Module& m, const std::string& x, OnnxGraphBuilder& b) {
    const auto& p = static_cast<const nn::AvgPool2d&>(m);
    return lower_pool("AveragePool", p.kernel_size, p.stride, p.padding, p.ceil_mode, x, b,
                      {{"count_include_pad", int64_t{p.count_include_pad ? 1 : 0}}});
  });
  l.add<nn::MultiheadAttention>(lower_attention);
  l.add<nn::TransformerEncoderLayer>(lower_encoder_layer);
}

}  // namespace dpar::io
