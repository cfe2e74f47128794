// ONNX export of the layers beyond the CNN set (pooling, LeakyReLU, SiLU, GELU in both forms,
// Tanh, LayerNorm, self-attention and TransformerEncoderLayer, batch- and sequence-first):
// export_onnx runs ONNX's checker and strict shape inference on every file, and dpar::infer
// (its node-by-node path) must reproduce the module's eval-mode output.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
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

// A sequence classifier on [N, S, E] (or [S, N, E]): an encoder layer, its first position,
// a Linear head - the shape of a user's own transformer.
struct SequenceClassifier : nn::Module {
  explicit SequenceClassifier(const nn::TransformerEncoderLayerOptions& o)
      : Module("SequenceClassifier"), batch_first(o.batch_first) {
    encoder = register_module("encoder", std::make_shared<nn::TransformerEncoderLayer>(o));
    head = register_module("head", std::make_shared<nn::Linear>(o.d_model, 4));
  }
  Tensor forward(const Tensor& x) override {
    return head->forward(encoder->forward(x).select(batch_first ? 1 : 0, 0));
  }
  const bool batch_first;
  std::shared_ptr<nn::TransformerEncoderLayer> encoder;
  std::shared_ptr<nn::Linear> head;
};

io::OnnxLowerings sequence_classifier_lowerings() {
  io::OnnxLowerings lowerings;
  lowerings.add<SequenceClassifier>([](const nn::Module& m, const std::string& x,
                                       io::OnnxGraphBuilder& b) {
    const auto& c = static_cast<const SequenceClassifier&>(m);
    const std::string first = b.add_node(
        "Gather", {b.lower(*c.encoder, "encoder", x), b.add_int64_initializer("first", {0}, {})},
        {{"axis", int64_t{c.batch_first ? 1 : 0}}});
    return b.lower(*c.head, "head", first);
  });
  return lowerings;
}

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
      std::make_shared<nn::Linear>(8, 4), std::make_shared<nn::BatchNorm1d>(4)});
  Generator gen(2);
  const Tensor x = testing::random_tensor({2, 3, 9, 9}, gen, -2, 2);
  std::map<std::string, int64_t> ops;
  io::OnnxExportOptions options;
  options.height = options.width = 9;
  CHECK(exported_error(model, x, options, io::OnnxLowerings(), &ops) < 1e-4);
  for (const char* op : {"MaxPool", "AveragePool", "LeakyRelu", "Sigmoid", "Erf", "Tanh",
                         "LayerNormalization", "BatchNormalization"}) {
    INFO(op);
    CHECK(ops.count(op) == 1);
  }
  // Adaptive pooling to more than 1x1 has no ONNX op: an error, not a global pool.
  nn::Sequential adaptive(std::vector<nn::ModulePtr>{std::make_shared<nn::AdaptiveAvgPool2d>(2),
                                                     std::make_shared<nn::Flatten>()});
  CHECK_THROWS_WITH(io::lower_to_onnx(adaptive, options),
                    Contains("export_onnx: 0: AdaptiveAvgPool2d(2, 2) has no ONNX op"));
  CHECK_THROWS_WITH(io::lower_to_onnx(nn::AdaptiveAvgPool2d(3), options),
                    Contains("export_onnx: <root>: AdaptiveAvgPool2d(3, 3)"));
}

TEST_CASE("self-attention lowers to MatMul, Softmax and Gather, batch- or sequence-first",
          "[export]") {
  manual_seed(3);
  SelfAttention model;
  io::OnnxLowerings lowerings;
  lowerings.add<SelfAttention>(
      [](const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
        const auto& s = static_cast<const SelfAttention&>(m);
        return b.lower(*s.attn, "attn", b.lower(*s.norm, "norm", x));
      });
  // This block returns [N, S, E], not classes, so it is checked as a graph; the encoder
  // layers below and the ViT (tests/parity/test_vit_parity.cpp) run end to end.
  io::OnnxExportOptions options;
  const io::OnnxGraph g = io::lower_to_onnx(model, options, lowerings);
  std::map<std::string, int> count;
  for (const auto& n : g.nodes) ++count[n.op_type];
  CHECK(count["MatMul"] == 4);  // in_proj, q k^T, probs v, out_proj
  CHECK(count["Softmax"] == 1);
  CHECK(count["Gather"] == 3);
  CHECK(count["LayerNormalization"] == 1);
  // Sequence-first: the same body between two Transposes of [S, N, E].
  nn::MultiheadAttention seq_first(12, 3);
  std::map<std::string, int> seq_count;
  for (const auto& n : io::lower_to_onnx(seq_first, options).nodes) ++seq_count[n.op_type];
  CHECK(seq_count["Transpose"] == count["Transpose"] + 2);
  CHECK(seq_count["MatMul"] == 4);
}

TEST_CASE("TransformerEncoderLayer exports and runs back, batch- and sequence-first", "[export]") {
  struct Case {
    bool batch_first, norm_first;
    nn::TransformerActivation activation;
  };
  for (const Case c : {Case{true, false, nn::TransformerActivation::relu},
                       Case{false, false, nn::TransformerActivation::gelu},
                       Case{false, true, nn::TransformerActivation::relu},
                       Case{true, true, nn::TransformerActivation::gelu}}) {
    INFO("batch_first " << c.batch_first << ", norm_first " << c.norm_first << ", gelu "
                        << (c.activation == nn::TransformerActivation::gelu));
    manual_seed(5);
    nn::TransformerEncoderLayerOptions o;
    o.d_model = 16;
    o.nhead = 4;
    o.dim_feedforward = 24;
    o.batch_first = c.batch_first;
    o.norm_first = c.norm_first;
    o.activation = c.activation;
    SequenceClassifier model(o);
    Generator gen(6);
    const int64_t n = 3, s = 7;
    const Tensor x = testing::random_tensor(
        c.batch_first ? Shape{n, s, o.d_model} : Shape{s, n, o.d_model}, gen, -2, 2);
    io::OnnxExportOptions options;
    options.input_shape = c.batch_first ? std::vector<int64_t>{0, s, o.d_model}
                                        : std::vector<int64_t>{s, 0, o.d_model};
    std::map<std::string, int64_t> ops;
    CHECK(exported_error(model, x, options, sequence_classifier_lowerings(), &ops) < 1e-4);
    CHECK(ops["LayerNormalization"] == 2);
    CHECK(ops["Softmax"] == 1);
    CHECK(ops.count("Erf") == (c.activation == nn::TransformerActivation::gelu ? 1u : 0u));
    CHECK(ops.count("Relu") == (c.activation == nn::TransformerActivation::relu ? 1u : 0u));
  }
}

TEST_CASE("a tensor input is declared as given, with no image preprocessing", "[export]") {
  manual_seed(7);
  nn::TransformerEncoderLayerOptions o;
  o.d_model = 8;
  o.nhead = 2;
  o.dim_feedforward = 8;
  o.batch_first = true;
  SequenceClassifier model(o);
  model.eval();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("dpar_export_tensor_input_" + std::to_string(::getpid()));
  io::OnnxExportOptions options;
  options.input_shape = {0, 5, 8};
  const io::OnnxExportResult r =
      io::export_onnx(model, dir.string(), options, sequence_classifier_lowerings());
  CHECK(r.num_classes == 4);
  CHECK(r.metadata.at("input_layout") == "tensor");
  CHECK(r.metadata.at("input_shape") == "-1,5,8");
  CHECK(r.metadata.count("mean") == 0);
  CHECK(r.metadata.count("input_size") == 0);
  const infer::Model m = infer::Model::load(r.model_path);
  CHECK(m.info().input_shape == Shape{-1, 5, 8});
  CHECK_FALSE(m.info().image_input);  // the infer tool refuses it by this
  std::ifstream json(r.json_path);
  const std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Contains("\"preprocess\": null"));
  CHECK_THAT(text, Contains("\"input_shape\": [\n    -1,\n    5,\n    8\n  ]"));
  std::filesystem::remove_all(dir);
  options.input_shape = {0, -5, 8};
  CHECK_THROWS_WITH(io::export_onnx(model, dir.string(), options, sequence_classifier_lowerings()),
                    Contains("input_shape[1] is -5"));
  CHECK_FALSE(std::filesystem::exists(dir));
}
