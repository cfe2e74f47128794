// Embedding, MultiheadAttention and TransformerEncoderLayer.
#include "dpar/nn/transformer.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "dpar/autograd/grad_mode.h"
#include "dpar/nn/init.h"

namespace dpar::nn {
namespace {

// The module convention's mask as an additive f32 tensor: u8 1 = "do not attend" -> -inf.
Tensor additive(const Tensor& mask) {
  if (mask.dtype() != DType::u8) return mask;
  const Device d = mask.device();
  return where(mask, Tensor::full({}, -std::numeric_limits<double>::infinity(), DType::f32, d),
               Tensor::zeros({}, DType::f32, d));
}

}  // namespace

// ---- Embedding -------------------------------------------------------------------------------
Embedding::Embedding(int64_t n, int64_t dim, std::optional<int64_t> pad)
    : Module("Embedding"),
      num_embeddings(n),
      embedding_dim(dim),
      padding_idx(pad && *pad < 0 ? std::optional<int64_t>(*pad + n) : pad) {
  DPAR_CHECK(n > 0 && dim > 0, "Embedding: sizes must be positive, got ", n, " x ", dim);
  DPAR_CHECK(!padding_idx || (*padding_idx >= 0 && *padding_idx < n), "Embedding: padding_idx ",
             pad.value_or(0), " is outside [", -n, ", ", n, ")");
  weight = register_parameter("weight", Tensor::empty({n, dim}));
  init::normal_(weight);
  if (padding_idx) {
    NoGradGuard no_grad;
    weight.select(0, *padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices, padding_idx); }

std::string Embedding::extra_repr() const {
  std::ostringstream os;
  os << num_embeddings << ", " << embedding_dim;
  if (padding_idx) os << ", padding_idx=" << *padding_idx;
  return os.str();
}

// ---- MultiheadAttention ---------------------------------------------------------------------
MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double p, bool bias, bool bf,
                                       Generator& gen)
    : Module("MultiheadAttention"),
      embed_dim(e),
      num_heads(h),
      dropout(p),
      batch_first(bf),
      gen_(&gen) {
  DPAR_CHECK(e > 0 && h > 0 && e % h == 0, "MultiheadAttention: embed_dim ", e,
             " must be divisible by num_heads ", h);
  DPAR_CHECK(p >= 0 && p < 1, "MultiheadAttention: dropout must be in [0, 1), got ", p);
  in_proj_weight = register_parameter("in_proj_weight", Tensor::empty({3 * e, e}));
  if (bias) in_proj_bias = register_parameter("in_proj_bias", Tensor::empty({3 * e}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, bias));
  reset_parameters(gen);
}

void MultiheadAttention::reset_parameters(Generator& gen) {
  init::xavier_uniform_(in_proj_weight, 1.0, gen);
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  if (out_proj->bias.defined()) init::zeros_(out_proj->bias);
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& attn_mask, const Tensor& key_padding_mask,
                                   bool is_causal) {
  return attend(query, key, value, attn_mask, key_padding_mask, is_causal, nullptr, false);
}

Tensor MultiheadAttention::forward_add(const Tensor& x, const Tensor& residual) {
  DPAR_CHECK(residual.defined() && residual.shape() == x.shape(),
             "MultiheadAttention::forward_add: residual ",
             residual.defined() ? residual.shape() : Shape{}, " must have the input's shape ",
             x.shape());
  return attend(x, x, x, {}, {}, false, nullptr, false, residual);
}

std::pair<Tensor, Tensor> MultiheadAttention::forward_with_weights(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask,
    const Tensor& key_padding_mask, bool average_attn_weights, bool is_causal) {
  Tensor weights;
  Tensor out = attend(query, key, value, attn_mask, key_padding_mask, is_causal, &weights,
                      average_attn_weights);
  return {out, weights};
}

Tensor MultiheadAttention::attend(const Tensor& query, const Tensor& key, const Tensor& value,
                                  const Tensor& attn_mask, const Tensor& key_padding_mask,
                                  bool is_causal, Tensor* weights, bool average_weights,
                                  const Tensor& residual) {
  for (const auto& [t, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}}) {
    DPAR_CHECK(t->defined() && t->dim() == 3 && t->size(2) == embed_dim,
               "MultiheadAttention: ", name, " must be ", batch_first ? "[N, L, " : "[L, N, ",
               embed_dim, "], got ", t->defined() ? t->shape() : Shape{});
  }
  // Work in [N, L, E].
  auto batch_major = [&](const Tensor& t) { return batch_first ? t : t.transpose(0, 1); };
  const Tensor q = batch_major(query), k = batch_major(key), v = batch_major(value);
  DPAR_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0) && k.size(1) == v.size(1),
             "MultiheadAttention: query ", query.shape(), ", key ", key.shape(), " and value ",
             value.shape(), " disagree in batch size or key length");
  const int64_t n = q.size(0), l = q.size(1), s = k.size(1), d = embed_dim / num_heads;
  const bool self_attention = query.is_same(key) && key.is_same(value);
  Tensor mask;
  if (attn_mask.defined()) {
    DPAR_CHECK((attn_mask.dim() == 2 && attn_mask.size(0) == l && attn_mask.size(1) == s) ||
                   (attn_mask.dim() == 3 && attn_mask.size(0) == n * num_heads &&
                    attn_mask.size(1) == l && attn_mask.size(2) == s),
               "MultiheadAttention: attn_mask must be [", l, ", ", s, "] or [", n * num_heads, ", ",
               l, ", ", s, "], got ", attn_mask.shape());
    mask = additive(attn_mask);
    if (mask.dim() == 3) mask = mask.reshape({n, num_heads, l, s});
  }
  if (key_padding_mask.defined()) {
    DPAR_CHECK(key_padding_mask.dim() == 2 && key_padding_mask.size(0) == n &&
                   key_padding_mask.size(1) == s,
               "MultiheadAttention: key_padding_mask must be [", n, ", ", s, "], got ",
               key_padding_mask.shape());
    const Tensor kpm = additive(key_padding_mask).reshape({n, 1, 1, s});
    mask = mask.defined() ? add(mask, kpm) : kpm;
  }
  bool causal = is_causal;
  if (is_causal && (mask.defined() || weights != nullptr)) {
    // With other masks, or on the explicit-ops weights path: the causal pattern is one more
    // additive mask.
    std::vector<float> tri(static_cast<size_t>(l * s), 0.f);
    for (int64_t i = 0; i < l; ++i) {
      for (int64_t j = i + 1; j < s; ++j) {
        tri[static_cast<size_t>(i * s + j)] = -std::numeric_limits<float>::infinity();
      }
    }
    const Tensor causal_mask = Tensor::from_vector(tri, {l, s}).to(q.device());
    mask = mask.defined() ? add(mask, causal_mask) : causal_mask;
    causal = false;
  }
  const double p = is_training() ? dropout : 0.0;
  Tensor out;
  auto heads = [&](const Tensor& t, int64_t len) {
    return t.reshape({n, len, num_heads, d}).transpose(1, 2);  // [N, H, len, d]
  };
  if (self_attention && weights == nullptr) {
    // One product with the packed [3E, E] weight; the attention reads its heads in place.
    out = packed_self_attention(linear(q, in_proj_weight, in_proj_bias), num_heads, mask, p, causal,
                                *gen_);
  } else {
    const auto w = chunk(in_proj_weight, 3, 0);
    const auto b = in_proj_bias.defined() ? chunk(in_proj_bias, 3, 0) : std::vector<Tensor>(3);
    const Tensor qh = heads(linear(q, w[0], b[0]), l), kh = heads(linear(k, w[1], b[1]), s),
                 vh = heads(linear(v, w[2], b[2]), s);
    if (weights == nullptr) {
      out = scaled_dot_product_attention(qh, kh, vh, mask, p, causal, std::nullopt, *gen_);
    } else {
      // torch's need_weights path, as explicit ops: the weights returned are the softmax after
      // attention dropout, averaged over the heads unless asked for per head.
      Tensor scores = mul(matmul(qh, kh.transpose(-2, -1)), 1.0 / std::sqrt(double(d)));
      if (mask.defined()) scores = add(scores, mask);  // causal already folded in above
      Tensor probs = softmax(scores, -1);
      if (p > 0) probs = ::dpar::dropout(probs, p, true, *gen_);
      out = matmul(probs, vh);
      *weights = average_weights ? mean(probs, {1}) : probs;
    }
    out = out.transpose(1, 2).reshape({n, l, embed_dim});
  }
  if (residual.defined()) {
    out = linear_add(out, out_proj->weight, out_proj->bias,
                     batch_first ? residual : residual.transpose(0, 1));
  } else {
    out = out_proj->forward(out);
  }
  return batch_first ? out : out.transpose(0, 1);
}

// ---- TransformerEncoderLayer ----------------------------------------------------------------
TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o,
                                                 Generator& gen)
    : Module("TransformerEncoderLayer"), options(o) {
  self_attn =
      register_module("self_attn", std::make_shared<MultiheadAttention>(
                                       o.d_model, o.nhead, o.dropout, true, o.batch_first, gen));
  linear1 = register_module("linear1", std::make_shared<Linear>(o.d_model, o.dim_feedforward));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout, gen));
  linear2 = register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, o.d_model));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(o.d_model, o.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(o.d_model, o.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout, gen));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout, gen));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  auto attention = [&](const Tensor& x) {
    return dropout1->forward(
        self_attn->forward(x, x, x, src_mask, src_key_padding_mask, is_causal));
  };
  auto feed_forward = [&](const Tensor& x) {
    Tensor h = linear1->forward(x);
    h = options.activation == TransformerActivation::gelu ? gelu(h) : relu(h);
    return dropout2->forward(linear2->forward(dropout->forward(h)));
  };
  Tensor x = src;
  if (options.norm_first) {
    x = add(x, attention(norm1->forward(x)));
    return add(x, feed_forward(norm2->forward(x)));
  }
  x = norm1->forward(add(x, attention(x)));
  return norm2->forward(add(x, feed_forward(x)));
}

}  // namespace dpar::nn
