// nn module parity with torch.nn 1.13: LayerNorm, GroupNorm, BatchNorm1d, Embedding,
// MultiheadAttention (batch-first self-attention with a key padding mask; sequence-first
// cross-attention with a u8 attn_mask; need_weights, averaged and per head) and
// TransformerEncoderLayer (post-norm ReLU; pre-norm GELU with a causal mask). Each module loads
// torch's state dict by name (strict), and its output, input gradients and parameter gradients are
// compared (1e-4 relative).
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <string>

#include "parity/parity_util.h"

namespace {

using namespace dpar;
using parity::check_close;
using parity::ErrorTable;
using parity::Fixture;

constexpr double kTolerance = 1e-4;

// The state dict ("sd." entries) without the prefix.
nn::NamedTensors state_of(const Fixture& f, const std::string& prefix = "sd.") {
  nn::NamedTensors out;
  for (const auto& [name, t] : f.entries()) {
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t.clone());
  }
  return out;
}

using Call = std::function<Tensor(nn::Module&, std::map<std::string, Tensor>&, const Fixture&)>;

void run_module(const std::string& name, nn::Module& module, const Call& call, ErrorTable& table) {
  INFO("module case " << name);
  const Fixture f("module_" + name + ".safetensors");
  const nn::LoadReport report = module.load_state_dict(state_of(f), /*strict=*/true);
  REQUIRE(report.ok());
  std::map<std::string, Tensor> inputs;
  for (const char* key : {"x", "k", "v"}) {
    if (f.has(key)) inputs[key] = f[key].clone().set_requires_grad();
  }
  const Tensor out = call(module, inputs, f);
  check_close(out, f["out"], kTolerance, name + " out", table, name + " forward");
  out.backward(f["grad_out"]);
  for (const auto& [key, t] : inputs) {
    check_close(t.grad(), f["grad." + key], kTolerance, name + " grad." + key, table,
                name + " backward");
  }
  for (const auto& [pname, p] : module.named_parameters()) {
    if (!f.has("grad." + pname)) continue;
    check_close(p.grad(), f["grad." + pname], kTolerance, name + " grad." + pname, table,
                name + " backward");
  }
  // State after the forward (BatchNorm's running statistics).
  for (const auto& [key, t] : state_of(f, "sd_after.")) {
    for (const auto& [bname, b] : module.named_buffers()) {
      if (bname == key && b.dtype() == DType::f32) {
        check_close(b, t, kTolerance, name + " " + key, table, name + " forward");
      }
    }
  }
}

}  // namespace

TEST_CASE("parity: nn modules match torch.nn", "[parity][modules]") {
  ErrorTable table;
  auto plain = [](nn::Module& m, std::map<std::string, Tensor>& in, const Fixture&) {
    return m.forward(in["x"]);
  };
  nn::LayerNorm layer_norm(16, 1e-6);
  run_module("layer_norm", layer_norm, plain, table);
  nn::GroupNorm group_norm(3, 6);
  run_module("group_norm", group_norm, plain, table);
  nn::BatchNorm1d batch_norm(5, 1e-5, 0.2);
  run_module("batch_norm1d", batch_norm, plain, table);
  nn::Embedding embedding(11, 6, 3);
  run_module(
      "embedding_pad", embedding,
      [](nn::Module& m, std::map<std::string, Tensor>&, const Fixture& f) {
        return m.forward(f["ids"]);
      },
      table);
  nn::MultiheadAttention mha_bf(24, 3, 0.0, true, /*batch_first=*/true);
  run_module(
      "mha_batch_first", mha_bf,
      [&](nn::Module&, std::map<std::string, Tensor>& in, const Fixture& f) {
        return mha_bf.forward(in["x"], in["x"], in["x"], {}, f["kpm"]);
      },
      table);
  nn::MultiheadAttention mha_cross(16, 4);
  run_module(
      "mha_seq_first_cross", mha_cross,
      [&](nn::Module&, std::map<std::string, Tensor>& in, const Fixture& f) {
        return mha_cross.forward(in["x"], in["k"], in["v"], f["mask"]);
      },
      table);
  for (const bool average : {true, false}) {
    nn::MultiheadAttention mha_weights(16, 4);  // a fresh module: parameter gradients start at 0
    run_module(
        average ? "mha_weights_mean" : "mha_weights_heads", mha_weights,
        [&](nn::Module&, std::map<std::string, Tensor>& in, const Fixture& f) {
          const auto [out, weights] =
              mha_weights.forward_with_weights(in["x"], in["k"], in["v"], {}, f["kpm"], average);
          CHECK(weights.shape() == (average ? Shape{2, 5, 7} : Shape{2, 4, 5, 7}));
          return cat({out.reshape({-1}), weights.reshape({-1})}, 0);
        },
        table);
  }
  nn::TransformerEncoderLayer post(
      {.d_model = 16, .nhead = 2, .dim_feedforward = 32, .dropout = 0.0});
  run_module("encoder_post_relu", post, plain, table);
  nn::TransformerEncoderLayer pre({.d_model = 16,
                                   .nhead = 4,
                                   .dim_feedforward = 24,
                                   .dropout = 0.0,
                                   .activation = nn::TransformerActivation::gelu,
                                   .batch_first = true,
                                   .norm_first = true});
  pre.eval();
  run_module(
      "encoder_pre_gelu", pre,
      [&](nn::Module&, std::map<std::string, Tensor>& in, const Fixture& f) {
        return pre.forward(in["x"], f["mask"]);
      },
      table);
  table.print("nn module parity");
}
