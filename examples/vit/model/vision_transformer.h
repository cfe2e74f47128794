#pragma once
// Vision Transformer built as torchvision 0.14's VisionTransformer: the same modules and
// state-dict names (conv_proj, class_token, encoder.pos_embedding,
// encoder.layers.encoder_layer_<i>.{ln_1, self_attention, ln_2, mlp.0, mlp.3}, encoder.ln,
// heads.head), shapes and initialisation, so weights move both ways for the same
// configuration. in_channels other than 3 replaces conv_proj's input width (grey images).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dpar/nn/layers.h"
#include "dpar/nn/transformer.h"

namespace dpar::models {

struct VitConfig {
  int64_t image_size = 32;
  int64_t patch_size = 4;
  int64_t num_layers = 6;
  int64_t num_heads = 3;
  int64_t hidden_dim = 192;
  int64_t mlp_dim = 768;
  int64_t num_classes = 10;
  int64_t in_channels = 3;
  double dropout = 0.0;
  double attention_dropout = 0.0;
  int64_t seq_length() const {
    return (image_size / patch_size) * (image_size / patch_size) + 1;  // patches + class token
  }
};

// "ViT-Tiny" at 32 px: patch 4, width 192, depth 6, 3 heads, MLP 768 (the model).
VitConfig vit_tiny_config(int64_t num_classes = 10, int64_t in_channels = 3);

// Children run in order under the given names (torch's nn.Sequential(OrderedDict)).
class NamedSequential : public nn::Module {
 public:
  NamedSequential() : Module("Sequential") {}
  void add(const std::string& name, nn::ModulePtr module);
  Tensor forward(const Tensor& input) override;
  const std::vector<nn::ModulePtr>& modules() const { return modules_; }

 private:
  std::vector<nn::ModulePtr> modules_;
};

// Linear(in, mlp) -> GELU -> Dropout -> Linear(mlp, in) -> Dropout, children "0".."4";
// weights xavier-uniform, biases N(0, 1e-6) (torchvision's MLPBlock).
class MLPBlock : public nn::Sequential {
 public:
  MLPBlock(int64_t in_dim, int64_t mlp_dim, double dropout);
};

// x + dropout(attention(ln_1(x))), then + mlp(ln_2(.)): torchvision's pre-norm EncoderBlock.
class EncoderBlock : public nn::Module {
 public:
  EncoderBlock(int64_t num_heads, int64_t hidden_dim, int64_t mlp_dim, double dropout,
               double attention_dropout);
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::MultiheadAttention> self_attention;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<MLPBlock> mlp;
};

// pos_embedding [1, seq, hidden] ~ N(0, 0.02^2) added to the sequence, dropout, the blocks,
// a final LayerNorm.
class Encoder : public nn::Module {
 public:
  explicit Encoder(const VitConfig& config);
  Tensor forward(const Tensor& input) override;

  Tensor pos_embedding;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<NamedSequential> layers;
  std::shared_ptr<nn::LayerNorm> ln;
};

class VisionTransformer : public nn::Module {
 public:
  explicit VisionTransformer(const VitConfig& config);
  // [N, C, H, W] images -> [N, num_classes] logits.
  Tensor forward(const Tensor& images) override;
  // The patches as a sequence with the class token in front: [N, seq, hidden].
  Tensor embed(const Tensor& images);

  const VitConfig config;
  std::shared_ptr<nn::Conv2d> conv_proj;
  Tensor class_token;
  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<NamedSequential> heads;
};

}  // namespace dpar::models
