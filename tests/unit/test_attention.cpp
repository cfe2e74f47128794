// scaled_dot_product_attention: the fused CPU kernel against the same maths as an op chain
// (no mask, u8 and f32 masks, causal, custom scale), gradients against finite differences,
// and argument errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using Catch::Matchers::Contains;
using dpar::testing::gradcheck;
using dpar::testing::max_rel_error;
using dpar::testing::random_tensor;

namespace {

// softmax(q k^T * scale + mask) v, written out with the basic ops.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& additive,
                 double scale) {
  Tensor s = mul(matmul(q, k.transpose(-2, -1)), scale);
  if (additive.defined()) s = add(s, additive);
  return matmul(softmax(s, -1), v);
}

// The gradients of sum(out * g) with respect to each of `inputs`, which are cleared after.
std::vector<std::vector<float>> gradients(const Tensor& out, const Tensor& g,
                                          std::initializer_list<Tensor*> inputs) {
  sum(mul(out, g)).backward();
  std::vector<std::vector<float>> got;
  for (Tensor* t : inputs) {
    got.push_back(t->grad().to_float_vector());
    t->set_grad(Tensor());
  }
  return got;
}

Tensor causal_additive(int64_t lq, int64_t lk) {
  std::vector<float> m(static_cast<size_t>(lq * lk), 0.f);
  for (int64_t i = 0; i < lq; ++i) {
    for (int64_t j = i + 1; j < lk; ++j) {
      m[static_cast<size_t>(i * lk + j)] = -std::numeric_limits<float>::infinity();
    }
  }
  return Tensor::from_vector(m, {lq, lk});
}

}  // namespace

TEST_CASE("the fused attention kernel computes softmax(q k^T s + mask) v", "[attention]") {
  Generator gen(1);
  const Tensor q = random_tensor({2, 3, 5, 8}, gen), k = random_tensor({2, 3, 7, 8}, gen);
  const Tensor v = random_tensor({2, 3, 7, 4}, gen);
  const double s = 1.0 / std::sqrt(8.0);
  const Tensor out = scaled_dot_product_attention(q, k, v);
  REQUIRE(out.shape() == Shape{2, 3, 5, 4});
  CHECK(max_rel_error(out.to_float_vector(), reference(q, k, v, {}, s).to_float_vector()) < 1e-4);
  CHECK(max_rel_error(scaled_dot_product_attention(q, k, v, {}, 0.0, false, 0.3).to_float_vector(),
                      reference(q, k, v, {}, 0.3).to_float_vector()) < 1e-4);
  // A u8 mask (1 = attend) broadcast over batch and heads, and the f32 form of the same.
  std::vector<int64_t> keep(35);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = (i * 7 + 3) % 4 != 0 ? 1 : 0;
  for (int i = 0; i < 5; ++i) keep[static_cast<size_t>(i * 7)] = 1;  // every row sees a key
  const Tensor mask = Tensor::from_vector(keep, {5, 7}).to(DType::u8);
  const Tensor additive = where(mask, Tensor::zeros({}), Tensor::full({}, -INFINITY));
  const Tensor ref = reference(q, k, v, additive, s);
  CHECK(max_rel_error(scaled_dot_product_attention(q, k, v, mask).to_float_vector(),
                      ref.to_float_vector()) < 1e-4);
  CHECK(max_rel_error(scaled_dot_product_attention(q, k, v, additive).to_float_vector(),
                      ref.to_float_vector()) < 1e-4);
  // Causal: query i sees keys 0..i (top-left aligned).
  CHECK(max_rel_error(scaled_dot_product_attention(q, k, v, {}, 0.0, true).to_float_vector(),
                      reference(q, k, v, causal_additive(5, 7), s).to_float_vector()) < 1e-4);
  // Non-contiguous inputs (heads split from a [B, L, H*E] projection, as attention does).
  const Tensor packed = random_tensor({2, 5, 24}, gen);
  const Tensor qh = packed.view({2, 5, 3, 8}).transpose(1, 2);
  CHECK(max_rel_error(scaled_dot_product_attention(qh, qh, qh).to_float_vector(),
                      reference(qh, qh, qh, {}, s).to_float_vector()) < 1e-4);
}

TEST_CASE("attention gradients match finite differences", "[attention][gradcheck]") {
  Generator gen(2);
  auto inputs = [&](int64_t lq, int64_t lk) {
    return std::vector<Tensor>{random_tensor({2, lq, 4}, gen).set_requires_grad(),
                               random_tensor({2, lk, 4}, gen).set_requires_grad(),
                               random_tensor({2, lk, 3}, gen).set_requires_grad()};
  };
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2]);
      },
      inputs(3, 5));
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, true);
      },
      inputs(4, 4));
  const Tensor mask = Tensor::from_vector(std::vector<float>{0, -1, 0, -INFINITY, 0, 2}, {2, 3});
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], mask);
      },
      inputs(2, 3));
  // With dropout the op chain runs; p = 0.5 with a fixed generator is a fixed mask.
  gradcheck(
      [](const std::vector<Tensor>& in) {
        Generator g(9);
        return scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.5, false, std::nullopt, g);
      },
      inputs(3, 3));
}

TEST_CASE("attention on head views of one projection: token-major results, gradients in place",
          "[attention][gradcheck]") {
  Generator gen(4);
  // Heads split from a [N, L, 3 * H * D] projection: strided [N, H, L, D] views, no copies.
  auto heads = [](const Tensor& packed, int64_t part) {
    return chunk(packed, 3, -1)[static_cast<size_t>(part)].reshape({2, 4, 2, 3}).transpose(1, 2);
  };
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        const Tensor out = scaled_dot_product_attention(heads(in[0], 0), heads(in[0], 1),
                                                        heads(in[0], 2), {}, 0.0, true);
        // The result is laid out token-major: heads back beside the features is a view.
        CHECK(out.transpose(1, 2).is_contiguous());
        return out.transpose(1, 2).reshape({2, 4, 6});
      },
      {random_tensor({2, 4, 18}, gen).set_requires_grad()});
}

TEST_CASE("packed_self_attention equals attention on the split heads", "[attention][gradcheck]") {
  Generator gen(5);
  const int64_t n = 2, l = 5, heads = 3, d = 4, e = heads * d;
  const Tensor qkv = random_tensor({n, l, 3 * e}, gen);
  // The same maths by hand: split q, k, v, split heads, attend, merge heads.
  auto by_hand = [&](const Tensor& packed, const Tensor& mask, bool causal) {
    const auto parts = chunk(packed, 3, -1);
    auto split = [&](const Tensor& t) { return t.reshape({n, l, heads, d}).transpose(1, 2); };
    return reference(split(parts[0]), split(parts[1]), split(parts[2]),
                     causal ? causal_additive(l, l) : mask, 1.0 / std::sqrt(double(d)))
        .transpose(1, 2)
        .reshape({n, l, e});
  };
  const Tensor out = packed_self_attention(qkv, heads);
  REQUIRE(out.shape() == Shape{n, l, e});
  CHECK(max_rel_error(out.to_float_vector(), by_hand(qkv, {}, false).to_float_vector()) < 1e-4);
  CHECK(max_rel_error(packed_self_attention(qkv, heads, {}, 0.0, true).to_float_vector(),
                      by_hand(qkv, {}, true).to_float_vector()) < 1e-4);
  // A key-padding style mask [N, 1, 1, L] broadcast over heads and queries.
  std::vector<float> pad(static_cast<size_t>(n * l), 0.f);
  pad[3] = pad[4] = pad[9] = -INFINITY;
  const Tensor mask = Tensor::from_vector(pad, {n, 1, 1, l});
  CHECK(max_rel_error(packed_self_attention(qkv, heads, mask).to_float_vector(),
                      by_hand(qkv, mask, false).to_float_vector()) < 1e-4);
  gradcheck(
      [&](const std::vector<Tensor>& in) { return packed_self_attention(in[0], heads, mask); },
      {random_tensor({n, l, 3 * e}, gen).set_requires_grad()});
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        return packed_self_attention(in[0], heads, {}, 0.0, true);
      },
      {random_tensor({n, l, 3 * e}, gen).set_requires_grad()});
  // Attention dropout runs the op chain; p = 0.5 with a fixed generator is a fixed mask.
  gradcheck(
      [&](const std::vector<Tensor>& in) {
        Generator g(9);
        return packed_self_attention(in[0], heads, {}, 0.5, false, g);
      },
      {random_tensor({n, l, 3 * e}, gen).set_requires_grad()});
  CHECK_THROWS_WITH(packed_self_attention(random_tensor({2, 5, 10}, gen), 3),
                    Contains("qkv must be an f32 tensor [N, L, 3 * E]"));
}

TEST_CASE("attention rows longer than a vector: tails, masks, the causal cut, gradients",
          "[attention]") {
  // Key counts around the 16-float vector the CPU's softmax works in (a masked tail, none, a
  // single-lane one as ViT's 65), and query counts around its groups of four rows, below and
  // above the key count under the causal cut; values and gradients against the op chain.
  Generator gen(6);
  for (const int64_t lk : {16, 33, 65}) {
    for (const int64_t lq : {1, 6, 70}) {
      for (const int variant : {0, 1, 2}) {  // plain, an additive mask, causal
        INFO("lq " << lq << ", lk " << lk << ", variant " << variant);
        Tensor q = random_tensor({1, 2, lq, 8}, gen).set_requires_grad();
        Tensor k = random_tensor({1, 2, lk, 8}, gen).set_requires_grad();
        Tensor v = random_tensor({1, 2, lk, 5}, gen).set_requires_grad();
        Tensor additive;
        if (variant == 1) {
          // -inf on every fifth key (in the tail lane too) and finite offsets elsewhere; key 0
          // stays visible so that no row is empty.
          std::vector<float> m(static_cast<size_t>(lq * lk));
          for (int64_t i = 0; i < lq; ++i) {
            for (int64_t j = 0; j < lk; ++j) {
              m[static_cast<size_t>(i * lk + j)] =
                  j > 0 && (i + j) % 5 == 0 ? -INFINITY : 0.25f * static_cast<float>((i + j) % 3);
            }
          }
          additive = Tensor::from_vector(m, {lq, lk});
        }
        const bool causal = variant == 2;
        const Tensor g = random_tensor({1, 2, lq, 5}, gen);
        const Tensor fused = scaled_dot_product_attention(q, k, v, additive, 0.0, causal);
        const Tensor chain =
            reference(q, k, v, causal ? causal_additive(lq, lk) : additive, 1.0 / std::sqrt(8.0));
        CHECK(max_rel_error(fused.to_float_vector(), chain.to_float_vector()) < 1e-4);
        const auto fused_grads = gradients(fused, g, {&q, &k, &v});
        const auto chain_grads = gradients(chain, g, {&q, &k, &v});
        for (size_t i = 0; i < 3; ++i) CHECK(max_rel_error(fused_grads[i], chain_grads[i]) < 1e-3);
      }
    }
  }
}

TEST_CASE("attention's backward where only a few query rows of the gradient are nonzero",
          "[attention]") {
  // A classifier that reads the class token: in the last block only query 0's output reaches
  // the loss, so dO is zero but for that row (here also row 40 in head 0, and none at all in
  // head 1 of the second sample). The fused backward computes with those rows alone; against
  // the op chain, plain, masked and causal, and dQ exactly zero on the other rows.
  Generator gen(7);
  const int64_t lq = 65, lk = 65;
  for (const int variant : {0, 1, 2}) {
    INFO("variant " << variant);
    Tensor q = random_tensor({2, 2, lq, 8}, gen).set_requires_grad();
    Tensor k = random_tensor({2, 2, lk, 8}, gen).set_requires_grad();
    Tensor v = random_tensor({2, 2, lk, 5}, gen).set_requires_grad();
    const Tensor additive = variant == 1 ? random_tensor({lq, lk}, gen) : Tensor();
    const bool causal = variant == 2;
    std::vector<float> gv(2 * 2 * lq * 5, 0.f);
    const std::vector<float> dense = random_tensor({5, 5}, gen).to_float_vector();
    for (int64_t slice = 0; slice < 4; ++slice) {
      if (slice == 3) continue;  // sample 1, head 1: no gradient at all
      std::copy_n(dense.begin() + slice * 5, 5, gv.begin() + slice * lq * 5);
    }
    std::copy_n(dense.begin() + 20, 5, gv.begin() + 40 * 5);
    const Tensor g = Tensor::from_vector(gv, {2, 2, lq, 5});
    const Tensor fused = scaled_dot_product_attention(q, k, v, additive, 0.0, causal);
    const Tensor chain =
        reference(q, k, v, causal ? causal_additive(lq, lk) : additive, 1.0 / std::sqrt(8.0));
    const auto fused_grads = gradients(fused, g, {&q, &k, &v});
    const auto chain_grads = gradients(chain, g, {&q, &k, &v});
    for (size_t i = 0; i < 3; ++i) CHECK(max_rel_error(fused_grads[i], chain_grads[i]) < 1e-3);
    const std::vector<float>& dq = fused_grads[0];
    for (const int64_t row : {1, 39, 41, 64}) {
      INFO("dQ row " << row);
      CHECK(std::all_of(dq.begin() + row * 8, dq.begin() + (row + 1) * 8,
                        [](float x) { return x == 0.f; }));
    }
  }
  // Finite differences through packed_self_attention read at its first token only.
  gradcheck(
      [](const std::vector<Tensor>& in) { return packed_self_attention(in[0], 2).slice(1, 0, 1); },
      {random_tensor({2, 5, 3 * 4}, gen).set_requires_grad()});
}

TEST_CASE("attention argument errors name the tensors", "[attention]") {
  const Tensor q = Tensor::zeros({2, 3, 4}), k = Tensor::zeros({2, 5, 4});
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, Tensor::zeros({2, 5, 3}), k),
                    Contains("differ in the embedding dim"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, Tensor::zeros({2, 4, 4})),
                    Contains("differ in length"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, k, Tensor::zeros({3, 5}), 0.0, true),
                    Contains("not both"));
  CHECK_THROWS_WITH(
      scaled_dot_product_attention(q, Tensor::zeros({3, 5, 4}), Tensor::zeros({3, 5, 4})),
      Contains("same leading (batch, head) dims"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, k, Tensor::zeros({3, 5}, DType::i64)),
                    Contains("attn_mask must be u8"));
}
