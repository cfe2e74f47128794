// The nn modules of a second model: names, shapes, reprs and initialisation as torch.nn
// (LayerNorm, GroupNorm, BatchNorm1d, pooling, activations, Embedding, MultiheadAttention,
// TransformerEncoderLayer), masks, modes and errors. Values against torch: parity tests.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "dpar/dpar.h"

using namespace dpar;
using Catch::Matchers::Contains;

namespace {
std::vector<std::string> names_of(const nn::NamedTensors& entries) {
  std::vector<std::string> out;
  for (const auto& [name, t] : entries) out.push_back(name);
  return out;
}
}  // namespace

TEST_CASE("norm, pooling and activation modules carry torch's names and reprs", "[nn]") {
  nn::LayerNorm ln(8);
  CHECK(names_of(ln.state_dict()) == std::vector<std::string>{"weight", "bias"});
  CHECK(ln.repr() == "LayerNorm((8,), eps=1e-05, elementwise_affine=True)");
  CHECK(nn::LayerNorm(Shape{2, 3}, 1e-6, false).state_dict().empty());
  nn::GroupNorm gn(2, 6);
  CHECK(gn.repr() == "GroupNorm(2, 6, eps=1e-05, affine=True)");
  nn::BatchNorm1d bn(5);
  CHECK(bn.repr() == "BatchNorm1d(5, eps=1e-05, momentum=0.1, affine=True)");
  CHECK(names_of(bn.state_dict()) == std::vector<std::string>{"weight", "bias", "running_mean",
                                                              "running_var",
                                                              "num_batches_tracked"});
  bn.forward(Tensor::ones({4, 5}));
  CHECK(bn.num_batches_tracked.item() == 1);
  CHECK_THROWS_WITH(bn.forward(Tensor::ones({4, 6})), Contains("expected [N,5] or [N,5,L]"));
  CHECK(nn::MaxPool2d(3, 2, 1).repr() ==
        "MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)");
  CHECK(nn::AvgPool2d(2).repr() == "AvgPool2d(kernel_size=2, stride=2, padding=0)");
  CHECK(nn::MaxPool2d(2).forward(Tensor::ones({1, 1, 4, 4})).shape() == Shape{1, 1, 2, 2});
  CHECK(nn::AdaptiveAvgPool2d(2, 3).repr() == "AdaptiveAvgPool2d(output_size=(2, 3))");
  CHECK(nn::AdaptiveAvgPool2d(2, 3).forward(Tensor::ones({1, 2, 5, 7})).shape() ==
        Shape{1, 2, 2, 3});
  CHECK(nn::GELU().repr() == "GELU(approximate='none')");
  CHECK(nn::GELU(GeluApproximation::tanh).repr() == "GELU(approximate='tanh')");
  CHECK(nn::LeakyReLU(0.2).repr() == "LeakyReLU(negative_slope=0.2)");
  const Tensor x = Tensor::from_vector(std::vector<float>{-1, 2}, {2});
  CHECK(nn::SiLU().forward(x).to_float_vector() == silu(x).to_float_vector());
  CHECK(nn::Tanh().forward(x).to_float_vector() == dpar::tanh(x).to_float_vector());
}

TEST_CASE("Embedding and MultiheadAttention follow torch's layout and init", "[nn]") {
  manual_seed(0);
  nn::Embedding emb(10, 4, -1);  // the last row pads
  CHECK(*emb.padding_idx == 9);
  CHECK(emb.repr() == "Embedding(10, 4, padding_idx=9)");
  const std::vector<float> w = emb.weight.to_float_vector();
  for (int j = 0; j < 4; ++j) CHECK(w[static_cast<size_t>(36 + j)] == 0.f);
  double var = 0;
  for (size_t i = 0; i < 36; ++i) var += w[i] * w[i];
  CHECK(var / 36 == Approx(1.0).margin(0.6));  // N(0, 1)

  nn::MultiheadAttention mha(12, 3);
  CHECK(names_of(mha.state_dict()) == std::vector<std::string>{"in_proj_weight", "in_proj_bias",
                                                               "out_proj.weight", "out_proj.bias"});
  CHECK(mha.in_proj_weight.shape() == Shape{36, 12});
  const double bound = std::sqrt(6.0 / (36 + 12));
  for (float v : mha.in_proj_weight.to_float_vector()) CHECK(std::abs(v) <= bound);
  for (float v : mha.in_proj_bias.to_float_vector()) CHECK(v == 0.f);
  for (float v : mha.out_proj->bias.to_float_vector()) CHECK(v == 0.f);
  // Sequence-first by default: [L, N, E] in and out; a padded key changes nothing for the
  // others when masked out.
  Generator gen(1);
  Tensor x = Tensor::empty({4, 2, 12});
  nn::init::normal_(x, 0, 1, gen);
  CHECK(mha.forward(x).shape() == Shape{4, 2, 12});
  const Tensor kpm =
      Tensor::from_vector(std::vector<int64_t>{0, 0, 0, 1, 0, 0, 0, 0}, {2, 4}).to(DType::u8);
  Tensor y1 = mha.forward(x, x, x, {}, kpm);
  Tensor x2 = x.clone();
  x2.select(0, 3).select(0, 0).fill_(5.0);  // change the padded key of sample 0
  Tensor y2 = mha.forward(x2, x2, x2, {}, kpm);
  CHECK(y1.select(0, 0).select(0, 0).to_float_vector() ==
        y2.select(0, 0).select(0, 0).to_float_vector());
  CHECK_THROWS_WITH(nn::MultiheadAttention(10, 3), Contains("must be divisible by num_heads 3"));
  CHECK_THROWS_WITH(mha.forward(x, x, x, Tensor::zeros({3, 3}, DType::u8)),
                    Contains("attn_mask must be [4, 4]"));
}

TEST_CASE("TransformerEncoderLayer has torch's submodules; dropout only in training", "[nn]") {
  nn::TransformerEncoderLayer layer(
      {.d_model = 8, .nhead = 2, .dim_feedforward = 16, .dropout = 0.5, .batch_first = true});
  const std::vector<std::string> names = names_of(layer.state_dict());
  CHECK(names == std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                          "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                          "linear1.weight", "linear1.bias", "linear2.weight",
                                          "linear2.bias", "norm1.weight", "norm1.bias",
                                          "norm2.weight", "norm2.bias"});
  Tensor x = Tensor::ones({2, 3, 8});
  x.select(2, 0).fill_(3.0);
  layer.eval();
  const std::vector<float> a = layer.forward(x).to_float_vector();
  CHECK(layer.forward(x).to_float_vector() == a);  // eval: deterministic
  layer.train();
  CHECK(layer.forward(x).to_float_vector() != a);  // training: dropout
}

TEST_CASE("MultiheadAttention's weights under is_causal: nothing above the diagonal", "[nn]") {
  manual_seed(3);
  nn::MultiheadAttention mha(8, 2, 0.0, true, /*batch_first=*/true);
  std::vector<float> xs(2 * 4 * 8);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.37f * static_cast<float>(i));
  const Tensor x = Tensor::from_vector(xs, {2, 4, 8});
  const auto [out, weights] = mha.forward_with_weights(x, x, x, {}, {}, false, true);
  REQUIRE(weights.shape() == Shape{2, 2, 4, 4});
  const auto w = weights.to_float_vector();
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t i = 0; i < 4; ++i) {
      float row = 0.f;
      for (int64_t j = 0; j < 4; ++j) {
        const float v = w[static_cast<size_t>((b * 4 + i) * 4 + j)];
        if (j > i) CHECK(v == 0.f);
        row += v;
      }
      CHECK(std::abs(row - 1.f) < 1e-5f);
    }
  }
  // The same output as the fused path with is_causal.
  const auto fused = mha.forward(x, x, x, {}, {}, true).to_float_vector();
  const auto chain = out.to_float_vector();
  for (size_t i = 0; i < fused.size(); ++i) CHECK(std::abs(fused[i] - chain[i]) < 1e-5f);
}
