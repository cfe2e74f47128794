// scaled_dot_product_attention: a fused kernel where the backend has one (CPU), the same maths
// as a chain of differentiable ops elsewhere (CUDA) and whenever attention dropout is on.
#include <array>
#include <cmath>
#include <limits>

#include "dpar/autograd/function.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/attention_kernels.h"
#include "tensor/autocast_policy.h"
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

// A [N, H, L, D] operand of the fused kernels (unit stride along D, rows at least D apart);
// 4-D tensors keep their shape (a head view of a projection passes without a copy), others
// are made contiguous and seen as [1, batch, L, D].
Tensor kernel_operand(const Tensor& t) {
  if (t.dim() == 4) {
    const bool ready = (t.stride(3) == 1 || t.size(3) == 1) &&
                       (t.stride(2) >= t.size(3) || t.size(2) == 1) && t.stride(1) >= 0 &&
                       t.stride(0) >= 0;
    return ready ? t : t.contiguous();
  }
  return t.contiguous().view({1, shape_numel(batch_dims(t)), t.size(-2), t.size(-1)});
}

// A new [N, H, L, D] result for the kernels: for 4-D (head-split) operands laid out token-major,
// [N, L, H, D] in memory, so that moving the heads back beside the features and merging them
// (what an attention module does next) is a view, not a copy.
Tensor kernel_result(const Tensor& like, int64_t l, int64_t d, bool token_major) {
  const int64_t n = like.size(0), h = like.size(1);
  if (!token_major) return Tensor::empty({n, h, l, d}, DType::f32, like.device());
  return Tensor::from_storage(Tensor::empty({n, l, h, d}, DType::f32, like.device()).storage(), 0,
                              {n, h, l, d}, {l * h * d, d, h * d, 1}, DType::f32);
}

// The mask as the kernels take it: additive f32 [N*H, Lq, Lk], contiguous.
Tensor kernel_mask(const Tensor& attn_mask, Shape batch, int64_t lq, int64_t lk) {
  if (!attn_mask.defined()) return {};
  const int64_t count = shape_numel(batch);
  batch.push_back(lq);
  batch.push_back(lk);
  return additive_mask(attn_mask, batch).view({count, lq, lk});
}

void check_mask_dtype(const Tensor& attn_mask, const char* op) {
  if (attn_mask.defined()) {
    DPAR_CHECK(attn_mask.dtype() == DType::u8 || attn_mask.dtype() == DType::f32, op,
               ": attn_mask must be u8 (1 = attend) or f32 (added to the scores), got ",
               attn_mask.str());
  }
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator& gen) {
  DPAR_PROFILE_SCOPE("scaled_dot_product_attention");
  // f16/bf16 CUDA operands (autocast activations) are attended in f32 (fp32 list).
  const Tensor q = detail::f32_from_half(q_in), k = detail::f32_from_half(k_in),
               v = detail::f32_from_half(v_in);
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
  check_mask_dtype(attn_mask, op);
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  if (dropout_p > 0 || !kernels::sdpa_forward.available(q.device())) {
    return attention_by_ops(q, k, v, attn_mask, dropout_p, is_causal, sc, gen);
  }

  const int64_t lq = q.size(-2), ev = v.size(-1);
  const bool heads_given = q.dim() == 4;
  const Tensor q4 = kernel_operand(q), k4 = kernel_operand(k), v4 = kernel_operand(v);
  const Tensor mask = kernel_mask(attn_mask, batch_dims(q), lq, k.size(-2));
  Tensor out4 = kernel_result(q4, lq, ev, heads_given);
  Tensor probs = Tensor::empty({q4.size(0) * q4.size(1), lq, k.size(-2)}, DType::f32, q.device());
  kernels::sdpa_forward.get(q.device())(q4.detach(), k4.detach(), v4.detach(), mask, is_causal,
                                        static_cast<float>(sc), out4, probs);
  Shape out_shape = batch_dims(q);
  out_shape.push_back(lq);
  out_shape.push_back(ev);
  const Tensor out = heads_given ? out4 : out4.view(out_shape);
  if (autograd::needs_grad({q, k, v})) {
    autograd::record(
        op, {q, k, v}, {out},
        [q4 = q4.detach(), k4 = k4.detach(), v4 = v4.detach(), probs, o4 = out4.detach(), sc,
         heads_given, shapes = std::array{q.shape(), k.shape(), v.shape()}](
            const autograd::GradList& g, const autograd::NeedsGrad&) {
          Tensor dq = kernel_result(q4, q4.size(2), q4.size(3), heads_given);
          Tensor dk = kernel_result(k4, k4.size(2), k4.size(3), heads_given);
          Tensor dv = kernel_result(v4, v4.size(2), v4.size(3), heads_given);
          kernels::sdpa_backward.get(q4.device())(q4, k4, v4, probs, o4, kernel_operand(g[0]),
                                                  static_cast<float>(sc), dq, dk, dv);
          return autograd::GradList{dq.view(shapes[0]), dk.view(shapes[1]), dv.view(shapes[2])};
        });
  }
  return out;
}

Tensor packed_self_attention(const Tensor& qkv_in, int64_t num_heads, const Tensor& attn_mask,
                             double dropout_p, bool is_causal, Generator& gen) {
  DPAR_PROFILE_SCOPE("packed_self_attention");
  const Tensor qkv = detail::f32_from_half(qkv_in);  // as scaled_dot_product_attention
  const char* op = "packed_self_attention";
  DPAR_CHECK(num_heads > 0, op, ": num_heads must be positive, got ", num_heads);
  DPAR_CHECK(qkv.defined() && qkv.dtype() == DType::f32 && qkv.dim() == 3 &&
                 qkv.size(2) % (3 * num_heads) == 0,
             op, ": qkv must be an f32 tensor [N, L, 3 * E] with E a multiple of num_heads (",
             num_heads, "), got ", qkv.defined() ? qkv.str() : std::string("undefined"));
  DPAR_CHECK(!(is_causal && attn_mask.defined()), op,
             ": give attn_mask or is_causal, not both (as torch)");
  DPAR_CHECK(dropout_p >= 0 && dropout_p < 1, op, ": dropout_p must be in [0, 1), got ", dropout_p);
  check_mask_dtype(attn_mask, op);
  const int64_t n = qkv.size(0), l = qkv.size(1), e = qkv.size(2) / 3, d = e / num_heads;
  if (dropout_p > 0 || !kernels::sdpa_forward.available(qkv.device()) || n * l * e == 0) {
    const auto parts = chunk(qkv, 3, -1);
    auto heads = [&](const Tensor& t) { return t.reshape({n, l, num_heads, d}).transpose(1, 2); };
    return scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                        attn_mask, dropout_p, is_causal, std::nullopt, gen)
        .transpose(1, 2)
        .reshape({n, l, e});
  }
  // Part p (q, k, v) of a contiguous [N, L, 3E] tensor seen as [N, H, L, D], and a contiguous
  // [N, L, E] tensor seen the same way: the heads in place, no copies.
  auto part_heads = [n, l, e, d, num_heads](const Tensor& packed, int64_t p) {
    return Tensor::from_storage(packed.storage(), packed.storage_offset() + p * e,
                                {n, num_heads, l, d}, {l * 3 * e, d, 3 * e, 1}, DType::f32);
  };
  auto merged_heads = [n, l, e, d, num_heads](const Tensor& t) {
    return Tensor::from_storage(t.storage(), t.storage_offset(), {n, num_heads, l, d},
                                {l * e, d, e, 1}, DType::f32);
  };
  const Tensor packed = qkv.contiguous().detach();
  const Tensor mask = kernel_mask(attn_mask, {n, num_heads}, l, l);
  const float sc = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  Tensor out = Tensor::empty({n, l, e}, DType::f32, qkv.device());
  Tensor out4 = merged_heads(out);
  Tensor probs = Tensor::empty({n * num_heads, l, l}, DType::f32, qkv.device());
  kernels::sdpa_forward.get(qkv.device())(part_heads(packed, 0), part_heads(packed, 1),
                                          part_heads(packed, 2), mask, is_causal, sc, out4, probs);
  if (autograd::needs_grad({qkv})) {
    autograd::record(op, {qkv}, {out},
                     [packed, probs, o = out.detach(), sc, part_heads, merged_heads](
                         const autograd::GradList& g, const autograd::NeedsGrad&) {
                       Tensor dqkv = Tensor::empty(packed.shape(), DType::f32, packed.device());
                       Tensor dq = part_heads(dqkv, 0), dk = part_heads(dqkv, 1),
                              dv = part_heads(dqkv, 2);
                       kernels::sdpa_backward.get(packed.device())(
                           part_heads(packed, 0), part_heads(packed, 1), part_heads(packed, 2),
                           probs, merged_heads(o), merged_heads(g[0].contiguous()), sc, dq, dk, dv);
                       return autograd::GradList{dqkv};
                     });
  }
  return out;
}

}  // namespace dpar
