// Model-level parity with torchvision 0.14's VisionTransformer at the ViT-Tiny size of
// examples/vit: the state dict loads by name (strict) into dpar's model, and the logits and
// loss (1e-4) and the gradient of every parameter and of the input (1e-3) match.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "dpar/infer/runtime.h"
#include "model/vision_transformer.h"
#include "model/vision_transformer_onnx.h"
#include "parity/parity_util.h"

using namespace dpar;
using parity::check_close;
using parity::ErrorTable;
using parity::Fixture;

TEST_CASE("parity: VisionTransformer matches torchvision's", "[parity][vit]") {
  models::VisionTransformer model(models::vit_tiny_config(10, 3));
  const Fixture state("vit_state.safetensors");
  const nn::LoadReport report = model.load_state_dict(state.entries(), /*strict=*/true);
  INFO(report.str());
  REQUIRE(report.ok());
  // The same names in the same order as torchvision's state dict.
  const nn::NamedTensors ours = model.state_dict();
  REQUIRE(ours.size() == state.entries().size());
  for (size_t i = 0; i < ours.size(); ++i) CHECK(ours[i].first == state.entries()[i].first);

  const Fixture batch("vit_batch.safetensors");
  Tensor x = batch["x"].clone().set_requires_grad();
  model.train();
  const Tensor logits = model.forward(x);
  const Tensor loss = cross_entropy(logits, batch["target"]);
  ErrorTable table;
  check_close(logits, batch["logits"], 1e-4, "logits", table, "forward");
  check_close(loss, batch["loss"], 1e-4, "loss", table, "forward");
  loss.backward();
  check_close(x.grad(), batch["grad.x"], 1e-3, "grad.x", table, "input gradient");
  int compared = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    check_close(p.grad(), batch["grad." + name], 1e-3, "grad." + name, table,
                name.find("encoder_layer") != std::string::npos ? "block parameter gradients"
                                                                : "other parameter gradients");
    ++compared;
  }
  // 6 blocks x 12, class_token, conv_proj (2), pos_embedding, encoder.ln (2), heads.head (2).
  CHECK(compared == 80);
  table.print("VisionTransformer (ViT-Tiny) parity");
}

TEST_CASE("parity: the exported ViT ONNX file passes ONNX's checks and matches torch",
          "[parity][vit][export]") {
  models::VisionTransformer model(models::vit_tiny_config(10, 3));
  REQUIRE(model.load_state_dict(Fixture("vit_state.safetensors").entries(), true).ok());
  model.eval();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dpar_vit_export_" + std::to_string(::getpid())))
          .string();
  for (const bool softmax : {false, true}) {
    INFO("softmax " << softmax);
    const io::OnnxExportResult r = models::export_vision_transformer(model, dir, softmax);
    CHECK(r.num_classes == 10);
    CHECK(r.op_counts.count("LayerNormalization") == 1);
    CHECK(r.op_counts.at("LayerNormalization") == 13);  // 2 per block + the final one
    const Fixture ref("vit_export_ref.safetensors");
    const std::string cmd =
        std::string(DPAR_PYTHON) + " " + DPAR_PARITY_SCRIPTS + "/onnx_check.py --model '" +
        r.model_path + "' --ref '" + ref.path() + "' --output " + (softmax ? "probs" : "logits") +
        " --ops Conv,Reshape,Transpose,Pad,Add,LayerNormalization,MatMul,Gather,Mul,Softmax,"
        "Div,Erf,Gemm";
    CHECK(std::system(cmd.c_str()) == 0);
    // dpar::infer runs the file node by node (the interpreter path) to torch's outputs.
    infer::Model m = infer::Model::load(r.model_path);
    CHECK(m.info().outputs_probabilities == softmax);
    CHECK(m.plan_summary({1, 3, 32, 32}).front().rfind("interpreted: ", 0) == 0);
    ErrorTable table;
    for (const char* b : {"1", "3"}) {
      const Tensor got = m.run(ref[std::string("x") + b]);
      check_close(got, ref[std::string(softmax ? "probs" : "logits") + b], 1e-4,
                  std::string("infer batch ") + b, table, "dpar::infer");
    }
    table.print("dpar::infer on the exported ViT");
  }
  std::filesystem::remove_all(dir);
}
