// scaled_dot_product_attention: a fused kernel where the backend has one (CPU), the same maths
// as a chain of differentiable ops elsewhere (CUDA) and whenever attention dropout is on.
#include <cmath>
#include <limits>

#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/attention_kernels.h"
#include "tensor/broadcast.h"

namespace dpar {
namespace {

Shape batch_dims(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// The mask as an additive f32 tensor broadcast to [batch..., Lq, Lk]: a u8 mask keeps the
// positions that are 1 (torch's boolean attn_mask: True takes part) and gives -inf elsewhere.
Tensor additive_mask(const Tensor& mask, const Shape& full) {
  Tensor m = mask;
  if (mask.dtype() == DType::u8) {
    m = where(
        mask, Tensor::zeros({}, DType::f32, mask.device()),
        Tensor::full({}, -std::numeric_limits<double>::infinity(), DType::f32, mask.device()));
  }
  Tensor dense = Tensor::empty(full, DType::f32, mask.device());
  dense.copy_(detail::expand_to(m, full));
  return dense;
}

// 1 above the diagonal (the keys a query may not see under is_causal), as u8 [Lq, Lk].
Tensor causal_block(int64_t lq, int64_t lk, Device device) {
  std::vector<int64_t> v(static_cast<size_t>(lq * lk));
  for (int64_t i = 0; i < lq; ++i) {
    for (int64_t j = 0; j < lk; ++j) v[static_cast<size_t>(i * lk + j)] = j > i ? 1 : 0;
  }
  return Tensor::from_vector(v, {lq, lk}).to(DType::u8).to(device);
}

Tensor attention_by_ops(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        double dropout_p, bool is_causal, double scale, Generator& gen) {
  Tensor s = mul(matmul(q, k.transpose(-2, -1)), scale);
  if (mask.defined()) {
    Shape full = batch_dims(q);
    full.push_back(q.size(-2));
    full.push_back(k.size(-2));
    s = add(s, additive_mask(mask, full));
  }
  if (is_causal) {
    s = masked_fill(s, causal_block(q.size(-2), k.size(-2), q.device()),
                    -std::numeric_limits<double>::infinity());
  }
  Tensor p = softmax(s, -1);
  if (dropout_p > 0) p = dropout(p, dropout_p, true, gen);
  return matmul(p, v);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator& gen) {
  DPAR_PROFILE_SCOPE("scaled_dot_product_attention");
  const char* op = "scaled_dot_product_attention";
  for (const auto& [t, name] : {std::pair{&q, "query"}, {&k, "key"}, {&v, "value"}}) {
    DPAR_CHECK(t->defined() && t->dtype() == DType::f32 && t->dim() >= 2, op, ": ", name,
               " must be an f32 tensor [..., L, E], got ",
               t->defined() ? t->str() : std::string("undefined"));
    DPAR_CHECK(t->device() == q.device(), op, ": ", name, " on ", t->device(), " but query on ",
               q.device());
  }
  DPAR_CHECK(batch_dims(q) == batch_dims(k) && batch_dims(k) == batch_dims(v), op, ": query ",
             q.shape(), ", key ", k.shape(), " and value ", v.shape(),
             " must have the same leading (batch, head) dims");
  DPAR_CHECK(q.size(-1) == k.size(-1), op, ": query ", q.shape(), " and key ", k.shape(),
             " differ in the embedding dim");
  DPAR_CHECK(k.size(-2) == v.size(-2), op, ": key ", k.shape(), " and value ", v.shape(),
             " differ in length");
  DPAR_CHECK(!(is_causal && attn_mask.defined()), op,
             ": give attn_mask or is_causal, not both (as torch)");
  DPAR_CHECK(dropout_p >= 0 && dropout_p < 1, op, ": dropout_p must be in [0, 1), got ", dropout_p);
  if (attn_mask.defined()) {
    DPAR_CHECK(attn_mask.dtype() == DType::u8 || attn_mask.dtype() == DType::f32, op,
               ": attn_mask must be u8 (1 = attend) or f32 (added to the scores), got ",
               attn_mask.str());
  }
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  if (dropout_p > 0 || !kernels::sdpa_forward.available(q.device())) {
    return attention_by_ops(q, k, v, attn_mask, dropout_p, is_causal, sc, gen);
  }

  const int64_t lq = q.size(-2), lk = k.size(-2), e = q.size(-1), ev = v.size(-1);
  const int64_t batch = q.numel() / std::max<int64_t>(1, lq * e);
  const Tensor q3 = q.contiguous().view({batch, lq, e});
  const Tensor k3 = k.contiguous().view({batch, lk, e});
  const Tensor v3 = v.contiguous().view({batch, lk, ev});
  Tensor mask3;
  if (attn_mask.defined()) {
    Shape full = batch_dims(q);
    full.push_back(lq);
    full.push_back(lk);
    mask3 = additive_mask(attn_mask, full).view({batch, lq, lk});
  }
  Tensor out = Tensor::empty({batch, lq, ev}, DType::f32, q.device());
  Tensor probs = Tensor::empty({batch, lq, lk}, DType::f32, q.device());
  kernels::sdpa_forward.get(q.device())(q3.detach(), k3.detach(), v3.detach(), mask3, is_causal,
                                        static_cast<float>(sc), out, probs);
  if (autograd::needs_grad({q3, k3, v3})) {
    autograd::record(op, {q3, k3, v3}, {out},
                     [q3 = q3.detach(), k3 = k3.detach(), v3 = v3.detach(), probs, o = out.detach(),
                      sc](const autograd::GradList& g, const autograd::NeedsGrad&) {
                       const Tensor dout = g[0].is_contiguous() ? g[0] : g[0].contiguous();
                       Tensor dq = Tensor::empty(q3.shape(), DType::f32, q3.device());
                       Tensor dk = Tensor::empty(k3.shape(), DType::f32, k3.device());
                       Tensor dv = Tensor::empty(v3.shape(), DType::f32, v3.device());
                       kernels::sdpa_backward.get(q3.device())(q3, k3, v3, probs, o, dout,
                                                               static_cast<float>(sc), dq, dk, dv);
                       return autograd::GradList{dq, dk, dv};
                     });
  }
  Shape out_shape = batch_dims(q);
  out_shape.push_back(lq);
  out_shape.push_back(ev);
  return out.view(out_shape);
}

}  // namespace dpar
