#pragma once
// Embedding, MultiheadAttention and TransformerEncoderLayer with torch.nn's parameter names,
// shapes and initialisation, so state dicts move both ways.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "dpar/nn/activation.h"
#include "dpar/nn/layers.h"
#include "dpar/nn/normalization.h"

namespace dpar::nn {

// weight [num_embeddings, embedding_dim] ~ N(0, 1) (the padding row zeroed), looked up by i64
// indices of any shape; the padding_idx row gets no gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;
  const int64_t num_embeddings, embedding_dim;
  const std::optional<int64_t> padding_idx;  // normalised to [0, num_embeddings)
  Tensor weight;

 protected:
  std::string extra_repr() const override;
};

// torch.nn.MultiheadAttention (same embedding dim for query, key and value): parameters
// in_proj_weight [3E, E] (xavier-uniform), in_proj_bias [3E] (zeros), out_proj (a Linear whose
// bias starts at zero). Inputs are [L, N, E], or [N, L, E] with batch_first. Masks follow the
// module's convention (the opposite of scaled_dot_product_attention's): in a u8 attn_mask
// ([L, S] or [N*H, L, S]) or key_padding_mask ([N, S]) a 1 means "do not attend"; f32 masks are
// added to the scores. dropout applies to the attention weights in training mode. The
// attention itself is scaled_dot_product_attention (the fused CPU kernel). Returns the output
// only (torch's need_weights=False).
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false, Generator& gen = default_generator());
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& attn_mask = {}, const Tensor& key_padding_mask = {},
                 bool is_causal = false);
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }  // self-attention
  // forward(x) + residual (x's shape and layout) for self-attention, the residual added by the
  // output projection as it writes (linear_add): a transformer block's x + attention(x) with
  // one pass less over the activations.
  Tensor forward_add(const Tensor& x, const Tensor& residual);
  // torch's need_weights=True: the output and the attention weights, [N, L, S] averaged over
  // the heads (average_attn_weights, torch's default) or [N, H, L, S]; the weights are the
  // softmax after attention dropout, as torch returns them. Runs the attention as an op chain
  // (no fused kernel), so ask for weights only where they are used.
  std::pair<Tensor, Tensor> forward_with_weights(const Tensor& query, const Tensor& key,
                                                 const Tensor& value, const Tensor& attn_mask = {},
                                                 const Tensor& key_padding_mask = {},
                                                 bool average_attn_weights = true,
                                                 bool is_causal = false);
  void reset_parameters(Generator& gen = default_generator());

  const int64_t embed_dim, num_heads;
  const double dropout;
  const bool batch_first;
  Tensor in_proj_weight;
  Tensor in_proj_bias;  // undefined without bias
  std::shared_ptr<Linear> out_proj;

 private:
  // forward's body; fills *weights (the need_weights path) when weights is not null, and adds
  // residual to the result when it is defined.
  Tensor attend(const Tensor& query, const Tensor& key, const Tensor& value,
                const Tensor& attn_mask, const Tensor& key_padding_mask, bool is_causal,
                Tensor* weights, bool average_weights, const Tensor& residual = {});
  Generator* gen_;
};

enum class TransformerActivation : uint8_t { relu, gelu };

// torch.nn.TransformerEncoderLayer: self_attn, linear1, dropout, linear2, norm1, norm2,
// dropout1, dropout2, in torch's order and names. Post-norm by default
// (x = norm1(x + sa(x)); x = norm2(x + ff(x))), pre-norm with norm_first.
struct TransformerEncoderLayerOptions {
  int64_t d_model = 512;
  int64_t nhead = 8;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  TransformerActivation activation = TransformerActivation::relu;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
};

class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options,
                                   Generator& gen = default_generator());
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = {},
                 bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, {}); }

  const TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;
};

}  // namespace dpar::nn
