// ONNX export parity: torchvision MobileNetV3 weights (random, with perturbed BatchNorm
// statistics, from fixtures_export.py) are loaded into dpar's model and exported; then
// onnx_check.py (Debian's python3-onnx) runs the ONNX checker on the file and evaluates the
// graph with its numpy evaluator on batches of 1 and 3, against PyTorch's eval-mode outputs
// (relative error <= 1e-4), and checks the metadata. The C++ side checks what the exporter
// reports (every BatchNorm folded, only the expected ops) and its error handling.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "dpar/io/checkpoint.h"
#include "mobilenetv3/model/mobilenet_v3.h"
#include "mobilenetv3/model/mobilenet_v3_onnx.h"
#include "parity/parity_util.h"

namespace {

using namespace dpar;
using parity::check_close;
using parity::ErrorTable;
using parity::Fixture;
namespace fs = std::filesystem;

constexpr double kTolerance = 1e-4;

struct Case {
  std::string name;  // fixture prefix
  std::string arch;
  int64_t classes, side;
};
const Case kSmall{"small", "mobilenet_v3_small", 10, 64};
const Case kLarge{"large", "mobilenet_v3_large", 7, 32};

std::shared_ptr<models::MobileNetV3> load_model(const Case& c) {
  auto model = models::mobilenet_v3(c.arch, c.classes);
  const Fixture state("export_" + c.name + "_state.safetensors");
  model->load_state_dict(state.entries(), /*strict=*/true);
  model->eval();
  return model;
}

std::vector<std::string> class_names(int64_t n) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < n; ++i) names.push_back("class_" + std::to_string(i));
  return names;
}

int64_t count_batch_norms(const nn::Module& m) {
  int64_t n = 0;
  for (const auto& [name, mod] : m.named_modules()) n += mod->type_name() == "BatchNorm2d";
  return n;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs onnx_check.py; its per-check lines go to the test's output.
int run_onnx_check(const std::string& model, const std::string& ref, const std::string& output,
                   const std::string& meta) {
  const std::string cmd = std::string(DPAR_PYTHON) + " " + DPAR_PARITY_SCRIPTS +
                          "/onnx_check.py --model '" + model + "' --ref '" + ref + "' --output " +
                          output + " --tol " + std::to_string(kTolerance) + " --meta " + meta;
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  return std::system(cmd.c_str());
}

void export_and_check(const Case& c, bool softmax) {
  auto model = load_model(c);
  const Fixture ref("export_" + c.name + "_ref.safetensors");

  // dpar's own eval-mode forward first: the export starts from the same computation as torch.
  ErrorTable table;
  {
    NoGradGuard no_grad;
    for (const char* b : {"1", "3"}) {
      const Tensor logits = model->forward(ref[std::string("x") + b]);
      check_close(logits, ref[std::string("logits") + b], kTolerance, c.name + " logits" + b, table,
                  "dpar eval forward");
    }
  }
  table.print("MobileNetV3-" + c.name + " before export");

  io::OnnxExportOptions options;
  options.model_name = c.arch;
  options.height = options.width = c.side;
  options.softmax = softmax;
  options.class_names = class_names(c.classes);
  options.mean = {0.5f, 0.25f, 0.125f};
  options.std = {0.2f, 0.3f, 0.4f};
  const std::string dir =
      parity::fixture_dir() + "/export_" + c.name + (softmax ? "_probs" : "_logits");
  const io::OnnxExportResult r = models::export_mobilenet_v3(*model, dir, options);

  CHECK(r.model_path == dir + "/inference.onnx");
  CHECK(fs::is_regular_file(r.model_path));
  CHECK(fs::is_regular_file(r.json_path));
  CHECK(r.num_classes == c.classes);
  CHECK(r.folded_batch_norms == count_batch_norms(*model));
  CHECK(r.op_counts.count("BatchNormalization") == 0);
  CHECK(r.op_counts.count("Softmax") == (softmax ? 1u : 0u));
  // Dropout is gone: the classifier is Gemm, HardSwish, Gemm.
  CHECK(r.op_counts.at("Gemm") == 2);
  std::set<std::string> ops;
  for (const auto& [op, n] : r.op_counts) ops.insert(op);
  const std::set<std::string> allowed{"Conv", "Relu",   "HardSwish",         "HardSigmoid",
                                      "Mul",  "Add",    "GlobalAveragePool", "Flatten",
                                      "Gemm", "Softmax"};
  for (const std::string& op : ops) CHECK(allowed.count(op) == 1);
  // BN folded into the conv weights: the parameter count drops by the 4 vectors per BN and
  // gains one bias per conv that had none.
  std::printf("%s: %lld nodes, %lld BatchNorms folded, %lld parameters in the graph\n",
              c.arch.c_str(), static_cast<long long>(r.num_nodes),
              static_cast<long long>(r.folded_batch_norms),
              static_cast<long long>(r.num_parameters));

  std::string names;
  for (const std::string& n : options.class_names) {
    if (!names.empty()) names += ',';
    names += n;
  }
  std::string meta = "model_name=" + c.arch;
  meta += " num_classes=" + std::to_string(c.classes);
  meta += " input_size=" + std::to_string(c.side);
  meta += " mean=0.5,0.25,0.125 std=0.2,0.3,0.4";
  meta += std::string(" softmax=") + (softmax ? "true" : "false");
  meta += " class_names=" + names;
  meta += " dpar_version=" + version();
  const int rc = run_onnx_check(r.model_path, ref.path(), softmax ? "probs" : "logits", meta);
  CHECK(rc == 0);
}

}  // namespace

TEST_CASE("exported MobileNetV3-small (softmax) matches PyTorch", "[export]") {
  export_and_check(kSmall, /*softmax=*/true);
}

TEST_CASE("exported MobileNetV3-small (logits) matches PyTorch", "[export]") {
  export_and_check(kSmall, /*softmax=*/false);
}

TEST_CASE("exported MobileNetV3-large (softmax) matches PyTorch", "[export]") {
  export_and_check(kLarge, /*softmax=*/true);
}

TEST_CASE("a training checkpoint's model part exports the same model", "[export]") {
  // export_model accepts checkpoints: their model part must give the very same file.
  auto model = load_model(kSmall);
  io::OnnxExportOptions options;
  options.model_name = kSmall.arch;
  options.height = options.width = kSmall.side;
  const std::string path = parity::fixture_dir() + "/export_small.ckpt";
  io::TrainingState state;
  state.model_name = kSmall.arch;
  io::save_checkpoint(path, io::capture_checkpoint(*model, nullptr, nullptr, state));
  REQUIRE(io::is_checkpoint_file(path));

  auto restored = models::mobilenet_v3(kSmall.arch, kSmall.classes);
  restored->load_state_dict(io::load_checkpoint(path).model, /*strict=*/true);
  const auto lowerings = models::mobilenet_v3_lowerings();
  auto bytes_of = [&](const nn::Module& m) {
    io::OnnxGraph g = io::lower_to_onnx(m, options, lowerings);
    io::fold_batch_norms(g);
    return io::serialize_onnx(g, options);
  };
  CHECK(bytes_of(*restored) == bytes_of(*model));
}

TEST_CASE("a generic Sequential exports through the built-in lowerings", "[export]") {
  // Not MobileNetV3: conv + BN + hardswish, pooling, flatten, linear. BN is folded into a conv
  // with a bias; a BN that follows no conv stays a BatchNormalization node.
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(8),
      std::make_shared<nn::Hardswish>(), std::make_shared<nn::BatchNorm2d>(8),
      std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::Linear>(8, 4)});
  io::OnnxExportOptions options;
  options.model_name = "tiny";
  options.height = options.width = 8;
  io::OnnxGraph graph = io::lower_to_onnx(*net, options);
  CHECK(graph.nodes.size() == 7);  // Conv BN HardSwish BN GAP Flatten Gemm (Dropout gone)
  CHECK(graph.nodes[0].name == "0/Conv");
  CHECK(graph.nodes[0].inputs == std::vector<std::string>{"x", "0.weight", "0.bias"});
  CHECK(io::fold_batch_norms(graph) == 1);
  CHECK(graph.nodes.size() == 6);
  CHECK(graph.nodes[1].op_type == "HardSwish");
  CHECK(graph.nodes[2].op_type == "BatchNormalization");
  CHECK(graph.initializer("1.running_mean") == nullptr);  // folded BN's constants dropped
  CHECK(graph.initializer("3.running_mean") != nullptr);
  io::OnnxExportResult info;
  const std::string bytes = io::serialize_onnx(graph, options, &info);
  CHECK(!bytes.empty());
  CHECK(info.num_classes == 4);
  CHECK(info.metadata.at("input_size") == "8");
  CHECK(info.op_counts.at("BatchNormalization") == 1);

  // Class names that a comma-joined list would break are stored as a JSON array.
  options.class_names = {"a,b", "c", "d", "e"};
  options.height = 8;
  options.width = 6;
  io::serialize_onnx(graph, options, &info);
  CHECK(info.metadata.at("class_names") == R"(["a,b","c","d","e"])");
  CHECK(info.metadata.at("input_size") == "3,8,6");
}

TEST_CASE("export errors are clear and leave earlier exports alone", "[export]") {
  auto model = load_model(kSmall);
  io::OnnxExportOptions options;
  options.model_name = kSmall.arch;
  options.height = options.width = kSmall.side;
  const std::string dir = parity::fixture_dir() + "/export_errors";
  fs::remove_all(dir);
  models::export_mobilenet_v3(*model, dir, options);
  const std::string before = read_file(dir + "/inference.onnx");
  REQUIRE(!before.empty());

  SECTION("a module without a lowering is named with its path") {
    auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Conv2d>(3, 8, 1),
        std::make_shared<models::InvertedResidual>(
            models::InvertedResidualConfig(8, 3, 16, 8, true, false, 1))});
    // Built-in lowerings only: InvertedResidual is unknown to them.
    CHECK_THROWS_WITH(io::export_onnx(*net, dir, options),
                      Catch::Contains("no ONNX lowering for module '1' of type InvertedResidual"));
  }
  SECTION("class names must match the classes") {
    options.class_names = {"a", "b"};
    CHECK_THROWS_WITH(models::export_mobilenet_v3(*model, dir, options),
                      Catch::Contains("2 class names for a model with 10 classes"));
  }
  SECTION("an output directory that cannot be created") {
    const std::string file = dir + "/a_file";
    std::ofstream(file) << "x";
    CHECK_THROWS_WITH(models::export_mobilenet_v3(*model, file + "/sub", options),
                      Catch::Contains("cannot create output directory " + file + "/sub"));
  }
  SECTION("a failed write replaces nothing") {
    // inference.json.tmp is a directory: the json cannot be written after the model was.
    fs::create_directories(dir + "/inference.json.tmp");
    CHECK_THROWS_WITH(models::export_mobilenet_v3(*model, dir, options),
                      Catch::Contains("cannot write " + dir + "/inference.json.tmp"));
    CHECK(!fs::exists(dir + "/inference.onnx.tmp"));
    fs::remove_all(dir + "/inference.json.tmp");
  }
  CHECK(read_file(dir + "/inference.onnx") == before);
}
