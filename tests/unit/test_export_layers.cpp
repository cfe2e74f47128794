// ONNX export of the layers beyond the CNN set (pooling, LeakyReLU, SiLU, GELU in both forms,
// Tanh, LayerNorm, batch-first self-attention): export_onnx runs ONNX's checker and strict
// shape inference on every file, and dpar::infer (its node-by-node path) must reproduce the
// module's eval-mode output.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "dpar/dpar.h"
#include "gradcheck.h"

using namespace dpar;
using Catch::Matchers::Contains;

namespace {

// A module whose forward is x -> mha(x) on [N, S, E], for the attention lowering.
struct SelfAttention : nn::Module {
  SelfAttention() : Module("SelfAttention") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(12));
    attn =
        register_module("attn", std::make_shared<nn::MultiheadAttention>(12, 3, 0.0, true, true));
  }
  Tensor forward(const Tensor& x) override { return attn->forward(norm->forward(x)); }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::MultiheadAttention> attn;
};

double exported_error(nn::Module& model, const Tensor& x, io::OnnxExportOptions options,
                      const io::OnnxLowerings& lowerings, std::map<std::string, int64_t>* ops) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dpar_export_layers_" + std::to_string(::getpid()));
  model.eval();
  options.softmax = false;
  const io::OnnxExportResult r = io::export_onnx(model, dir.string(), options, lowerings);
  if (ops) *ops = r.op_counts;
  infer::Model m = infer::Model::load(r.model_path);
  const Tensor got = m.run(x);
  NoGradGuard no_grad;
  const Tensor want = model.forward(x);
  std::filesystem::remove_all(dir);
  return testing::max_rel_error(got.to_float_vector(), want.to_float_vector());
}

}  // namespace

TEST_CASE("pooling, activations and LayerNorm export and run back", "[export]") {
  manual_seed(1);
  nn::Sequential model(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 8, 3).padding(1)),
      std::make_shared<nn::LeakyReLU>(0.1), std::make_shared<nn::MaxPool2d>(3, 2, 1, true),
      std::make_shared<nn::SiLU>(), std::make_shared<nn::AvgPool2d>(2, 1, 1, false, false),
      std::make_shared<nn::GELU>(), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::GELU>(GeluApproximation::tanh), std::make_shared<nn::LayerNorm>(6),
      std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(8, 4)});
  Generator gen(2);
  const Tensor x = testing::random_tensor({2, 3, 9, 9}, gen, -2, 2);
  std::map<std::string, int64_t> ops;
  io::OnnxExportOptions options;
  options.height = options.width = 9;
  CHECK(exported_error(model, x, options, io::OnnxLowerings(), &ops) < 1e-4);
  for (const char* op :
       {"MaxPool", "AveragePool", "LeakyRelu", "Sigmoid", "Erf", "Tanh", "LayerNormalization"}) {
    INFO(op);
    CHECK(ops.count(op) == 1);
  }
}

TEST_CASE("batch-first self-attention lowers to MatMul, Softmax and Gather", "[export]") {
  manual_seed(3);
  SelfAttention model;
  io::OnnxLowerings lowerings;
  lowerings.add<SelfAttention>(
      [](const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
        const auto& s = static_cast<const SelfAttention&>(m);
        return b.lower(*s.attn, "attn", b.lower(*s.norm, "norm", x));
      });
  // The exporter declares an image-shaped input, so this block (on [N, S, E]) is checked as a
  // graph; the ViT's export runs it end to end (tests/parity/test_vit_parity.cpp).
  nn::MultiheadAttention seq_first(12, 3);
  io::OnnxExportOptions options;
  CHECK_THROWS_WITH(io::lower_to_onnx(seq_first, options), Contains("batch-first only"));
  const io::OnnxGraph g = io::lower_to_onnx(model, options, lowerings);
  std::map<std::string, int> count;
  for (const auto& n : g.nodes) ++count[n.op_type];
  CHECK(count["MatMul"] == 4);  // in_proj, q k^T, probs v, out_proj
  CHECK(count["Softmax"] == 1);
  CHECK(count["Gather"] == 3);
  CHECK(count["LayerNormalization"] == 1);
}
