// dpar::infer against PyTorch eval outputs on models torch.onnx.export wrote
// (fixtures_infer.py): MobileNetV3-small with BatchNorm folded by the exporter or left for the
// runtime to fold, a small net covering every supported op and fusion, and the rejection of
// unsupported, incomplete, truncated and corrupt files.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dpar/core/profiler.h"
#include "dpar/infer/runtime.h"
#include "infer/graph.h"
#include "infer/op_executor.h"
#include "mobilenetv3/model/mobilenet_v3_onnx.h"
#include "model_perturb.h"
#include "parity/parity_util.h"

namespace {

using namespace dpar;
using parity::check_close;
using parity::error_of;
using parity::ErrorTable;
using parity::Fixture;

constexpr double kTolerance = 1e-4;

std::string model_path(const std::string& name) { return parity::fixture_dir() + "/infer/" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("dpar_infer_" + std::to_string(getpid()) + "_" + name))
                               .string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

int count_steps(const std::vector<std::string>& plan, const std::string& prefix) {
  int n = 0;
  for (const std::string& line : plan) n += line.rfind(prefix, 0) == 0;
  return n;
}

TEST_CASE("MobileNetV3-small exported by torch matches PyTorch eval at batch 1 and 4") {
  const Fixture ref("infer/mobilenet.safetensors");
  infer::Model model = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  const infer::ModelInfo& info = model.info();
  CHECK(info.name == "mobilenet_v3_small");
  CHECK(info.input_height == 224);
  CHECK(info.input_width == 224);
  CHECK(info.resize_size == 0);
  CHECK(info.input_shape == Shape{-1, 3, 224, 224});
  CHECK(info.class_names.size() == 1000);
  CHECK(info.class_names.at(7) == "class_7");
  CHECK(info.std[2] == Approx(0.225f));
  CHECK_FALSE(info.outputs_probabilities);
  CHECK(info.opset == 14);

  ErrorTable table;
  for (int threads : {1, 2}) {
    model.set_num_threads(threads);
    const std::string t = " threads=" + std::to_string(threads);
    check_close(model.run(ref["x1"]), ref["logits1"], kTolerance, "logits batch 1" + t, table,
                "mobilenet logits");
    check_close(model.run(ref["x4"]), ref["logits4"], kTolerance, "logits batch 4" + t, table,
                "mobilenet logits");
  }
  // Back to a shape planned before: the cached plan gives bitwise the same answer.
  model.set_num_threads(1);
  const std::vector<float> a = model.run(ref["x1"]).to_float_vector();
  model.run(ref["x4"]);
  CHECK(model.run(ref["x1"]).to_float_vector() == a);
  // A batch-1 slice of the batch-4 input through the batch-1 plan.
  check_close(model.run(ref["x4"].slice(0, 2, 3)), ref["logits4"].slice(0, 2, 3), kTolerance,
              "logits batch 4, row 2 alone", table, "mobilenet logits");

  // Every activation, every residual Add and BN is fused: 52 convolutions, 10 average pools,
  // 9 SE multiplies, 2 inner products, the Flatten view, and nothing else.
  const std::vector<std::string> plan = model.plan_summary({1, 3, 224, 224});
  INFO([&] {
    std::string s;
    for (const auto& line : plan) s += line + "\n";
    return s;
  }());
  CHECK(count_steps(plan, "conv ") == 52);
  CHECK(count_steps(plan, "pooling ") == 10);
  CHECK(count_steps(plan, "binary ") == 9);
  CHECK(count_steps(plan, "inner_product ") == 2);
  CHECK(count_steps(plan, "eltwise ") == 0);
  CHECK(plan.size() <= 52 + 10 + 9 + 2 + 1 + 2);  // at most a reorder of the input and one more
  // Every convolution writes the layout the next one reads (blocked_activation_tag): no feature
  // map is reordered between layers, only the pooled vector before the Flatten may be.
  for (const std::string& line : plan) {
    if (line.rfind("reorder ", 0) == 0) CHECK(line.find(",1,1] ") != std::string::npos);
  }
  for (const std::string& line : plan) CHECK(line.find("ref:") == std::string::npos);
  table.print("infer mobilenet_v3_small");
}

TEST_CASE("at batch 4 the first layers run one image at a time, bitwise as the whole batch") {
  // plan_prefix.cpp: a 224 px MobileNetV3's stem and first blocks need more than a core's L2
  // per image, so a batch runs them image by image and only then the rest on the whole batch.
  const Fixture ref("infer/mobilenet.safetensors");
  infer::Model model = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  const std::vector<std::string> plan = model.plan_summary({4, 3, 224, 224});
  REQUIRE(plan.size() > 2);
  CHECK(plan[0].find("at a time") != std::string::npos);
  CHECK(count_steps(plan, "the rest on the whole batch") == 1);
  CHECK(model.plan_summary({1, 3, 224, 224})[0].find("at a time") == std::string::npos);
  const std::vector<float> split = model.run(ref["x4"]).to_float_vector();
  // The same batch planned without sub-batching (DPAR_INFER_SUB_BATCH=0 is read when a plan
  // is built; a new Model has none cached).
  ::setenv("DPAR_INFER_SUB_BATCH", "0", 1);
  infer::Model whole = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  const std::vector<std::string> whole_plan = whole.plan_summary({4, 3, 224, 224});
  const std::vector<float> together = whole.run(ref["x4"]).to_float_vector();
  ::unsetenv("DPAR_INFER_SUB_BATCH");
  CHECK(whole_plan[0].find("at a time") == std::string::npos);
  CHECK(split == together);
  ErrorTable table;
  check_close(Tensor::from_vector(split, {4, 1000}), ref["logits4"], kTolerance,
              "logits batch 4, sub-batched", table, "mobilenet logits");
  table.print("infer sub-batched prefix");
}

TEST_CASE("on 2 threads, steps too small to share run on one thread, bitwise as on two") {
  // plan_util.h, one_thread_work: at batch 1 the SE blocks' pools, 1x1 convolutions on 1x1 maps
  // and multiplies (and the pooled vector's reorder) cost less than waking a second thread.
  const Fixture ref("infer/mobilenet.safetensors");
  infer::Model model = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  model.set_num_threads(2);
  const std::vector<std::string> plan = model.plan_summary({1, 3, 224, 224});
  INFO([&] {
    std::string s;
    for (const auto& line : plan) s += line + "\n";
    return s;
  }());
  auto on_one_thread = [](const std::string& line) {
    return line.find("(on 1 thread)") != std::string::npos;
  };
  int marked = 0;
  for (const std::string& line : plan) {
    marked += on_one_thread(line);
    const bool se_step = line.find(",1,1] ") != std::string::npos;  // [1,C,1,1]
    CHECK(on_one_thread(line) == (se_step || line.rfind("binary ", 0) == 0));
  }
  CHECK(marked == 2 * 9 + 10 + 9 + 1);
  // The same plan with every step on both threads gives the same bits. (The variable is read
  // when a plan is built; the guard unsets it however this case ends.)
  struct UnsetOnExit {
    ~UnsetOnExit() { ::unsetenv("DPAR_INFER_ONE_THREAD_WORK"); }
  } unset_on_exit;
  ::setenv("DPAR_INFER_ONE_THREAD_WORK", "0", 1);
  infer::Model shared = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  shared.set_num_threads(2);
  const std::vector<std::string> shared_plan = shared.plan_summary({1, 3, 224, 224});
  const std::vector<float> on_both = shared.run(ref["x1"]).to_float_vector();
  ::setenv("DPAR_INFER_ONE_THREAD_WORK", "many", 1);
  infer::Model bad = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  bad.set_num_threads(1);  // read however many threads the plan has
  CHECK_THROWS_WITH(bad.plan_summary({1, 3, 224, 224}),
                    Catch::Contains("DPAR_INFER_ONE_THREAD_WORK") && Catch::Contains("'many'"));
  ::unsetenv("DPAR_INFER_ONE_THREAD_WORK");
  CHECK(std::none_of(shared_plan.begin(), shared_plan.end(), on_one_thread));
  CHECK(model.run(ref["x1"]).to_float_vector() == on_both);
  // On one thread there is nothing to mark.
  model.set_num_threads(1);
  const std::vector<std::string> single = model.plan_summary({1, 3, 224, 224});
  CHECK(std::none_of(single.begin(), single.end(), on_one_thread));
}

TEST_CASE("DPAR_PROFILE times dpar::infer's steps by kind of node") {
  const Fixture ref("infer/mobilenet.safetensors");
  infer::Model model = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  model.run(ref["x1"]);  // planned before profiling
  profiler::reset();
  profiler::set_enabled(true);
  model.run(ref["x1"]);
  model.run(ref["x1"]);
  profiler::set_enabled(false);
  std::map<std::string, int64_t> calls;
  for (const profiler::Row& r : profiler::rows()) {
    CHECK(r.nanoseconds > 0);
    calls[r.name] = r.calls;
  }
  profiler::reset();
  INFO([&] {
    std::string s;
    for (const auto& [name, n] : calls) s += name + ": " + std::to_string(n) + "\n";
    return s;
  }());
  // Two runs of the plan's 52 convolutions (the stem, 3x3 and 5x5 depthwise, 1x1 on maps and
  // on the SE blocks' 1x1 vectors), 10 pools, 9 SE multiplies and 2 inner products.
  int64_t convs = 0;
  for (const auto& [name, n] : calls) convs += name.rfind("infer conv ", 0) == 0 ? n : 0;
  CHECK(convs == 2 * 52);
  CHECK(calls["infer conv 3x3"] == 2);
  CHECK(calls["infer conv depthwise 3x3"] == 2 * 3);
  CHECK(calls["infer conv depthwise 5x5"] == 2 * 8);
  CHECK(calls["infer conv 1x1 on 1x1 maps"] == 2 * 2 * 9);
  CHECK(calls["infer pooling"] == 2 * 10);
  CHECK(calls["infer binary"] == 2 * 9);
  CHECK(calls["infer inner_product"] == 2 * 2);
}

TEST_CASE("BatchNormalization nodes are folded at load, an appended Softmax gives probs") {
  const Fixture ref("infer/mobilenet.safetensors");
  infer::Model model = infer::Model::load(model_path("mobilenet_v3_small_bn.onnx"));
  CHECK(model.info().outputs_probabilities);
  CHECK(model.info().name == "mobilenet_v3_small_bn");  // no metadata: the file name
  CHECK(model.info().class_names.empty());
  ErrorTable table;
  check_close(model.run(ref["x1"]), ref["probs1"], kTolerance, "probs batch 1", table, "probs");
  check_close(model.run(ref["x4"]), ref["probs4"], kTolerance, "probs batch 4", table, "probs");
  const std::vector<std::string> plan = model.plan_summary({4, 3, 224, 224});
  CHECK(count_steps(plan, "conv ") == 52);
  CHECK(count_steps(plan, "softmax ") == 1);
  CHECK(count_steps(plan, "eltwise ") == 0);
  int bn_fused = 0;
  for (const std::string& line : plan) {
    for (size_t p = line.find("BatchNormalization '"); p != std::string::npos;
         p = line.find("BatchNormalization '", p + 1)) {
      ++bn_fused;
    }
    if (line.find("BatchNormalization") != std::string::npos) CHECK(line.rfind("conv ", 0) == 0);
  }
  CHECK(bn_fused == 34);
  table.print("infer mobilenet_v3_small with BatchNormalization nodes");
}

TEST_CASE("every supported op and fusion pattern matches PyTorch (opset 14 and 12)") {
  const Fixture ref("infer/ops.safetensors");
  ErrorTable table;
  for (const char* file : {"ops.onnx", "ops_opset12.onnx"}) {
    infer::Model model = infer::Model::load(model_path(file));
    check_close(model.run(ref["x"]), ref["y"], kTolerance, std::string(file) + " batch 2", table,
                "ops net");
    check_close(model.run(ref["x"].slice(0, 1, 2)), ref["y"].slice(0, 1, 2), kTolerance,
                std::string(file) + " batch 1", table, "ops net");
    // Channels-last input: the runtime takes any layout.
    check_close(model.run(ref["x"].contiguous(MemoryFormat::ChannelsLast)), ref["y"], kTolerance,
                std::string(file) + " channels-last input", table, "ops net");
    const std::vector<std::string> plan = model.plan_summary({2, 3, 20, 24});
    std::string all;
    for (const auto& line : plan) all += line + "\n";
    INFO(all);
    // The residual sum is fused into the later of the two convolutions feeding it, and the
    // ReLU after the sum with it.
    CHECK(all.find("Add") != std::string::npos);
    CHECK(count_steps(plan, "conv ") == 7);
    CHECK(count_steps(plan, "inner_product ") == 2);
  }
  table.print("infer ops net");
}

TEST_CASE("the op executor (dpar::infer's GPU path) matches PyTorch when run on the CPU") {
  // The same lowered program the oneDNN plan executes, run with dpar's tensor ops: on a GPU
  // these are the CUDA kernels; here the CPU ones check the executor's own logic.
  ErrorTable table;
  const Fixture mobilenet("infer/mobilenet.safetensors");
  const Fixture ops("infer/ops.safetensors");
  struct Case {
    const char* file;
    const Fixture& ref;
    const char* x;
    const char* y;
  };
  for (const Case& c : {Case{"mobilenet_v3_small.onnx", mobilenet, "x4", "logits4"},
                        Case{"mobilenet_v3_small_bn.onnx", mobilenet, "x1", "probs1"},
                        Case{"ops.onnx", ops, "x", "y"}, Case{"ops_opset12.onnx", ops, "x", "y"}}) {
    const infer::detail::Program program =
        infer::detail::lower(infer::detail::load_onnx(model_path(c.file)));
    const infer::detail::OpExecutor executor(program, Device::cpu());
    check_close(executor.run(c.ref[c.x]), c.ref[c.y], kTolerance, c.file, table, "op executor");
  }
  table.print("op executor on the CPU");
  // Through the public API, the CPU device keeps the oneDNN plan and a missing GPU is refused.
  infer::Model model = infer::Model::load(model_path("ops.onnx"));
  model.set_device(Device::cpu());
  CHECK(model.device().is_cpu());
  if (cuda_device_count() == 0) {
    CHECK_THAT(error_of([&] { model.set_device(Device::cuda(0)); }),
               Catch::Contains("cuda:0 is not available"));
  }
}

TEST_CASE("dpar's own ONNX export (io::export_onnx) runs on dpar::infer like the eager model") {
  manual_seed(5);
  auto model = models::mobilenet_v3_small(10);
  testing::perturb_model(*model);
  model->eval();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dpar_infer_export_" + std::to_string(getpid())))
          .string();
  io::OnnxExportOptions options;
  options.model_name = "mobilenet_v3_small";
  options.height = options.width = 96;
  options.class_names = {"t-shirt", "trouser", "pullover", "dress", "coat",
                         "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  models::export_mobilenet_v3(*model, dir, options);
  infer::Model runtime = infer::Model::load(dir + "/inference.onnx");
  std::filesystem::remove_all(dir);
  const infer::ModelInfo& info = runtime.info();
  CHECK(info.name == "mobilenet_v3_small");
  CHECK(info.input_height == 96);
  CHECK(info.resize_size == 96 * 256 / 224);
  CHECK(info.outputs_probabilities);
  CHECK(info.class_names == options.class_names);

  Generator gen(2);
  std::vector<float> xv(3 * 3 * 96 * 96);
  for (float& v : xv) v = gen.normal();
  const Tensor x = Tensor::from_vector(xv, {3, 3, 96, 96});
  Tensor expected;
  {
    NoGradGuard no_grad;
    expected = softmax(model->forward(x), 1);
  }
  ErrorTable table;
  check_close(runtime.run(x), expected, kTolerance, "probs batch 3", table, "export -> infer");
  check_close(runtime.run(x.slice(0, 1, 2)), expected.slice(0, 1, 2), kTolerance, "probs batch 1",
              table, "export -> infer");
  const std::vector<std::string> plan = runtime.plan_summary({3, 3, 96, 96});
  CHECK(count_steps(plan, "conv ") == 52);
  CHECK(count_steps(plan, "eltwise ") == 0);
  table.print("infer on dpar's export");
}

TEST_CASE("unsupported ops are rejected, all named in one error") {
  const std::string path = model_path("unsupported.onnx");
  const std::string err = error_of([&] { infer::Model::load(path); });
  INFO(err);
  CHECK(err.find(path + ": unsupported ONNX ops: Resize (node 'up'), LSTM (node 'lstm_1'), "
                        "com.microsoft:FusedConv (node 'fc')") == 0);
}

TEST_CASE("a missing initializer is named with the node that needs it") {
  const std::string err = error_of([&] { infer::Model::load(model_path("missing_init.onnx")); });
  INFO(err);
  CHECK(err.find("missing_init.onnx: missing tensors") != std::string::npos);
  CHECK(err.find("'w_missing' (input 1 of Conv 'conv1')") != std::string::npos);
}

TEST_CASE("a graph output no node produces is an error at load, not a crash") {
  // Found by fuzz_onnx_model: the node-by-node path looked the output up with map::at.
  const std::string err = error_of([&] { infer::Model::load(model_path("dangling_output.onnx")); });
  INFO(err);
  CHECK(err.find("dangling_output.onnx: the graph output 'y' is not produced") !=
        std::string::npos);
}

TEST_CASE("a node listing fewer inputs than its op requires is an error at load") {
  // Found by fuzz_onnx_model: the node-by-node path indexed LayerNormalization's missing scale.
  const std::string err = error_of([&] { infer::Model::load(model_path("short_inputs.onnx")); });
  INFO(err);
  CHECK(err.find("short_inputs.onnx: LayerNormalization 'ln' needs 2 inputs, the file gives 1") !=
        std::string::npos);
}

TEST_CASE("a node without outputs is an error at load") {
  // Found by fuzz_onnx_model: the planned runtime read the node's first output with vector::at.
  const std::string err = error_of([&] { infer::Model::load(model_path("no_output.onnx")); });
  INFO(err);
  CHECK(err.find("no_output.onnx: Relu 'lost' has no output") != std::string::npos);
}

TEST_CASE("shapes that do not fit are reported at load when the input shape is fixed") {
  const std::string err = error_of([&] { infer::Model::load(model_path("bad_shape.onnx")); });
  INFO(err);
  CHECK(err.find("bad_shape.onnx: Conv 'conv': input [1,3,8,8] has 3 channels, weight "
                 "[4,5,1,1] with group 1 needs 5") != std::string::npos);
}

TEST_CASE("inference-mode Dropout and Identity are no-ops") {
  infer::Model model = infer::Model::load(model_path("dropout.onnx"));
  const Tensor x =
      Tensor::from_vector(std::vector<float>{-1.f, 2.f, -3.f, 4.f, 5.f, -6.f, 0.f, 7.f}, {2, 4});
  CHECK(model.run(x).to_float_vector() ==
        std::vector<float>{0.f, 2.f, 0.f, 4.f, 5.f, 0.f, 0.f, 7.f});
  CHECK(model.plan_summary({2, 4}).size() == 1);  // the Relu alone
}

TEST_CASE("Concat runs node by node, along any axis") {
  infer::Model model = infer::Model::load(model_path("concat.onnx"));
  const Tensor x = Tensor::from_vector(std::vector<float>{-1.f, 2.f, -3.f, 4.f}, {1, 4});
  const Tensor y = model.run(x);
  CHECK(y.shape() == Shape{2, 8});
  CHECK(y.to_float_vector() == std::vector<float>{-1.f, 2.f, -3.f, 4.f, 0.f, 2.f, 0.f, 4.f,  //
                                                  9.f, 9.f, 9.f, 9.f, 9.f, 9.f, 9.f, 9.f});
  // An axis outside the rank (a file can say anything) is an error naming the node.
  infer::Model bad = infer::Model::load(model_path("concat_bad_axis.onnx"));
  const std::string err = error_of([&] { bad.run(x); });
  INFO(err);
  CHECK(err.find("Concat 'cat': axis 2 is outside a rank-2 input") != std::string::npos);
  // axis is required (ONNX gives it no default).
  infer::Model no_axis = infer::Model::load(model_path("concat_no_axis.onnx"));
  const std::string missing = error_of([&] { no_axis.run(x); });
  INFO(missing);
  CHECK(missing.find("Concat 'cat': the required attribute axis is missing") != std::string::npos);
}

TEST_CASE("truncated and corrupt ONNX files give a clear error naming the file") {
  const std::string good = read_bytes(model_path("mobilenet_v3_small.onnx"));
  REQUIRE(good.size() > 1000000);
  for (size_t keep : {size_t{0}, size_t{7}, size_t{5000}, good.size() / 2, good.size() - 1}) {
    const std::string path = write_temp("truncated.onnx", good.substr(0, keep));
    const std::string err = error_of([&] { infer::Model::load(path); });
    INFO("kept " << keep << " of " << good.size() << " bytes: " << err);
    CHECK(err.rfind(path + ": ", 0) == 0);
    std::filesystem::remove(path);
  }
  std::string garbage(4096, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 7919) % 251);
  const std::string path = write_temp("garbage.onnx", garbage);
  const std::string err = error_of([&] { infer::Model::load(path); });
  INFO(err);
  CHECK(err.rfind(path + ": not ", 0) == 0);
  std::filesystem::remove(path);
}

TEST_CASE("inputs that do not fit the model are rejected") {
  infer::Model model = infer::Model::load(model_path("mobilenet_v3_small.onnx"));
  std::string err = error_of([&] { model.run(Tensor::zeros({1, 1, 224, 224})); });
  CHECK(err.find("expects input [N,3,224,224], got [1,1,224,224]") != std::string::npos);
  err = error_of([&] { model.run(Tensor::zeros({3, 224, 224})); });
  CHECK(err.find("expects input [N,3,224,224], got [3,224,224]") != std::string::npos);
  err = error_of([&] { model.run(Tensor::zeros({1, 3, 224, 224}, DType::i64)); });
  CHECK(err.find("expected a float32 input") != std::string::npos);
}

}  // namespace
