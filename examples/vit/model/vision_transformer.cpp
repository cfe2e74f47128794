#include "model/vision_transformer.h"

#include <cmath>

#include "dpar/nn/init.h"

namespace dpar::models {

VitConfig vit_tiny_config(int64_t num_classes, int64_t in_channels) {
  VitConfig c;
  c.num_classes = num_classes;
  c.in_channels = in_channels;
  return c;
}

void NamedSequential::add(const std::string& name, nn::ModulePtr module) {
  modules_.push_back(register_module(name, std::move(module)));
}

Tensor NamedSequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& m : modules_) x = m->forward(x);
  return x;
}

MLPBlock::MLPBlock(int64_t in_dim, int64_t mlp_dim, double p)
    : nn::Sequential(std::vector<nn::ModulePtr>{
          std::make_shared<nn::Linear>(in_dim, mlp_dim), std::make_shared<nn::GELU>(),
          std::make_shared<nn::Dropout>(p), std::make_shared<nn::Linear>(mlp_dim, in_dim),
          std::make_shared<nn::Dropout>(p)}) {
  for (size_t i : {size_t{0}, size_t{3}}) {
    auto linear = at<nn::Linear>(i);
    nn::init::xavier_uniform_(linear->weight);
    nn::init::normal_(linear->bias, 0.0, 1e-6);
  }
}

EncoderBlock::EncoderBlock(int64_t num_heads, int64_t hidden_dim, int64_t mlp_dim, double p,
                           double attention_p)
    : Module("EncoderBlock") {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(hidden_dim, 1e-6));
  self_attention = register_module(
      "self_attention", std::make_shared<nn::MultiheadAttention>(hidden_dim, num_heads, attention_p,
                                                                 true, /*batch_first=*/true));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(p));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(hidden_dim, 1e-6));
  mlp = register_module("mlp", std::make_shared<MLPBlock>(hidden_dim, mlp_dim, p));
}

Tensor EncoderBlock::forward(const Tensor& input) {
  DPAR_CHECK(input.dim() == 3, "EncoderBlock: expected [N, seq, hidden], got ", input.shape());
  // The residual adds run inside the output projections (linear_add) where the dropout before
  // them is the identity (p = 0, torchvision's default, or eval).
  const bool dropout_is_identity = !dropout->is_training() || dropout->p == 0.0;
  const Tensor x =
      dropout_is_identity
          ? self_attention->forward_add(ln_1->forward(input), input)
          : add(dropout->forward(self_attention->forward(ln_1->forward(input))), input);
  return mlp->forward_add(ln_2->forward(x), x);
}

Encoder::Encoder(const VitConfig& c) : Module("Encoder") {
  pos_embedding =
      register_parameter("pos_embedding", Tensor::empty({1, c.seq_length(), c.hidden_dim}));
  nn::init::normal_(pos_embedding, 0.0, 0.02);  // from BERT, as torchvision
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
  layers = register_module("layers", std::make_shared<NamedSequential>());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    layers->add("encoder_layer_" + std::to_string(i),
                std::make_shared<EncoderBlock>(c.num_heads, c.hidden_dim, c.mlp_dim, c.dropout,
                                               c.attention_dropout));
  }
  ln = register_module("ln", std::make_shared<nn::LayerNorm>(c.hidden_dim, 1e-6));
}

Tensor Encoder::forward(const Tensor& input) {
  DPAR_CHECK(input.dim() == 3 && input.size(1) == pos_embedding.size(1) &&
                 input.size(2) == pos_embedding.size(2),
             "Encoder: expected [N, ", pos_embedding.size(1), ", ", pos_embedding.size(2),
             "], got ", input.shape());
  return ln->forward(layers->forward(dropout->forward(add(input, pos_embedding))));
}

VisionTransformer::VisionTransformer(const VitConfig& c) : Module("VisionTransformer"), config(c) {
  DPAR_CHECK(c.image_size % c.patch_size == 0, "VisionTransformer: image size ", c.image_size,
             " is not a multiple of the patch size ", c.patch_size);
  DPAR_CHECK(c.hidden_dim % c.num_heads == 0, "VisionTransformer: hidden_dim ", c.hidden_dim,
             " is not a multiple of num_heads ", c.num_heads);
  // torchvision registers class_token first, then the modules.
  class_token = register_parameter("class_token", Tensor::zeros({1, 1, c.hidden_dim}));
  conv_proj = register_module(
      "conv_proj",
      std::make_shared<nn::Conv2d>(
          nn::Conv2dOptions(c.in_channels, c.hidden_dim, c.patch_size).stride(c.patch_size)));
  encoder = register_module("encoder", std::make_shared<Encoder>(c));
  heads = register_module("heads", std::make_shared<NamedSequential>());
  auto head = std::make_shared<nn::Linear>(c.hidden_dim, c.num_classes);
  heads->add("head", head);
  // torchvision's init: the patchify stem truncated-normal with std sqrt(1 / fan_in) (bounds
  // +-2 absolute), a zero classifier.
  const double fan_in = static_cast<double>(c.in_channels * c.patch_size * c.patch_size);
  nn::init::trunc_normal_(conv_proj->weight, 0.0, std::sqrt(1.0 / fan_in));
  nn::init::zeros_(conv_proj->bias);
  nn::init::zeros_(head->weight);
  nn::init::zeros_(head->bias);
}

Tensor VisionTransformer::embed(const Tensor& images) {
  DPAR_CHECK(images.dim() == 4 && images.size(1) == config.in_channels &&
                 images.size(2) == config.image_size && images.size(3) == config.image_size,
             "VisionTransformer: expected [N, ", config.in_channels, ", ", config.image_size, ", ",
             config.image_size, "] images, got ", images.shape());
  const int64_t n = images.size(0);
  // [N, hidden, h, w] -> [N, h*w, hidden]: the patches in row-major order, as torchvision's
  // reshape + permute (channels-last output makes this a view).
  const Tensor patches =
      conv_proj->forward(images).permute({0, 2, 3, 1}).reshape({n, -1, config.hidden_dim});
  return cat({expand(class_token, {n, 1, config.hidden_dim}), patches}, 1);
}

Tensor VisionTransformer::forward(const Tensor& images) {
  const Tensor x = encoder->forward(embed(images));
  return heads->forward(x.select(1, 0));  // the class token's output
}

}  // namespace dpar::models
