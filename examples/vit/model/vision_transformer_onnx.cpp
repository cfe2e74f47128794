#include "model/vision_transformer_onnx.h"

#include "dpar/data/transforms.h"

namespace dpar::models {
namespace {

std::string lower_named_sequential(const nn::Module& m, const std::string& x,
                                   io::OnnxGraphBuilder& b) {
  std::string y = x;
  for (const auto& [name, child] : m.named_children()) y = b.lower(*child, name, y);
  return y;
}

std::string lower_mlp(const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
  const auto& mlp = static_cast<const MLPBlock&>(m);
  std::string y = io::lower_linear_matmul(*mlp.at<nn::Linear>(0), "0", x, b);
  y = b.lower(*mlp[1], "1", y);  // GELU
  return io::lower_linear_matmul(*mlp.at<nn::Linear>(3), "3", y, b);
}

std::string lower_block(const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
  const auto& blk = static_cast<const EncoderBlock&>(m);
  const std::string attended =
      b.lower(*blk.self_attention, "self_attention", b.lower(*blk.ln_1, "ln_1", x));
  const std::string y = b.add_node("Add", {attended, x});
  return b.add_node("Add", {y, b.lower(*blk.mlp, "mlp", b.lower(*blk.ln_2, "ln_2", y))});
}

std::string lower_encoder(const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
  const auto& enc = static_cast<const Encoder&>(m);
  const std::string y =
      b.add_node("Add", {x, b.add_initializer("pos_embedding", enc.pos_embedding)});
  return b.lower(*enc.ln, "ln", b.lower(*enc.layers, "layers", y));
}

std::string lower_vit(const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
  const auto& vit = static_cast<const VisionTransformer&>(m);
  const int64_t d = vit.config.hidden_dim;
  // [N, D, h, w] -> [N, h*w, D]: the patches in row-major order.
  const std::string patches =
      b.add_node("Transpose",
                 {b.add_node("Reshape", {b.lower(*vit.conv_proj, "conv_proj", x),
                                         b.add_int64_initializer("patch_shape", {0, d, -1}, {3})})},
                 {{"perm", std::vector<int64_t>{0, 2, 1}}});
  // A zero row in front of the sequence, then class_token added into it: the concatenation
  // without an Expand to the (dynamic) batch size.
  const std::string padded =
      b.add_node("Pad", {patches, b.add_int64_initializer("pads", {0, 1, 0, 0, 0, 0}, {6})});
  Tensor token_row = Tensor::zeros({1, vit.config.seq_length(), d});
  token_row.select(1, 0).copy_(vit.class_token.detach().select(1, 0));
  const std::string seq = b.add_node("Add", {padded, b.add_initializer("class_token", token_row)});
  const std::string encoded = b.lower(*vit.encoder, "encoder", seq);
  const std::string cls = b.add_node(
      "Gather", {encoded, b.add_int64_initializer("class_index", {0}, {})}, {{"axis", int64_t{1}}});
  return b.lower(*vit.heads, "heads", cls);
}

}  // namespace

void add_vision_transformer_lowerings(io::OnnxLowerings& l) {
  l.add<NamedSequential>(lower_named_sequential);
  l.add<MLPBlock>(lower_mlp);
  l.add<EncoderBlock>(lower_block);
  l.add<Encoder>(lower_encoder);
  l.add<VisionTransformer>(lower_vit);
}

io::OnnxExportResult export_vision_transformer(const VisionTransformer& model,
                                               const std::string& dir, bool softmax) {
  io::OnnxLowerings lowerings;
  add_vision_transformer_lowerings(lowerings);
  io::OnnxExportOptions options;
  options.model_name = "vit_tiny";
  options.channels = model.config.in_channels;
  options.height = options.width = model.config.image_size;
  options.softmax = softmax;
  options.resize_size = model.config.image_size;
  if (model.config.in_channels == 1) {
    options.mean = {data::ToTensorNormalize::kFashionMnistMean};
    options.std = {data::ToTensorNormalize::kFashionMnistStd};
    options.metadata["color_format"] = "GRAY";
  }
  return io::export_onnx(model, dir, options, lowerings);
}

}  // namespace dpar::models
