// dpar::infer on int8 (QDQ) models against a numpy evaluation of the same graph (qdq_eval.py:
// ONNX QuantizeLinear/DequantizeLinear semantics, torch conv2d on the dequantized values):
// a hand-made small model (fixtures_infer_int8.py), and MobileNetV3-small quantized by dpar's
// own exporter (io::quantize_qdq) and checked by qdq_eval.py. Then the errors for QDQ pairs
// dpar cannot run in int8.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "dpar/infer/runtime.h"
#include "dpar/io/onnx_quantize.h"
#include "mobilenetv3/model/mobilenet_v3.h"
#include "mobilenetv3/model/mobilenet_v3_onnx.h"
#include "parity/parity_util.h"
#include "tensor/cpu/onednn_context.h"

namespace {

using namespace dpar;
using parity::error_of;
namespace fs = std::filesystem;

std::string model_path(const std::string& name) {
  return parity::fixture_dir() + "/infer_int8/" + name;
}

int count_steps(const std::vector<std::string>& plan, const std::string& prefix) {
  int n = 0;
  for (const std::string& line : plan) n += line.rfind(prefix, 0) == 0;
  return n;
}

std::string joined(const std::vector<std::string>& plan) {
  std::string s;
  for (const auto& line : plan) s += line + "\n";
  return s;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(double(x[i]) - double(y[i])));
  return m;
}

// oneDNN's int8 kernels are exact (s32 accumulation) with VNNI. Without it, the weights of layers
// with pairs of input channels are halved (by oneDNN for s8 sources, by dpar's make_int8 for u8)
// so that 16-bit intermediate sums cannot overflow: the results then only approximate the QDQ
// graph, and the tests check a looser bound. The models here have such layers.
bool exact_int8() { return cpu::onednn::has_int8_dot_product(); }

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_float_vector()) m = std::max(m, double(std::abs(v)));
  return m;
}

TEST_CASE("a hand-made QDQ model runs in int8 within one output quantisation step") {
  const parity::Fixture ref("infer_int8/small.safetensors");
  infer::Model model = infer::Model::load(model_path("small.onnx"));
  CHECK(model.info().precision == "int8");
  const bool exact = exact_int8();
  const double step = ref.float_at("step");
  const double bound = exact ? step : 0.1 * max_abs(ref["y"]);
  if (!exact) std::printf("no VNNI: checking within 10 %% of max|reference| = %.3g\n", bound);
  for (int threads : {1, 2}) {
    model.set_num_threads(threads);
    const double err = max_abs_diff(model.run(ref["x"]), ref["y"]);
    std::printf("small QDQ model, %d thread(s): max |dpar - reference| = %.3g, step %.3g\n",
                threads, err, step);
    CHECK(err <= bound);
  }
  // With VNNI every Conv/Gemm is an int8 primitive. c1 and pw write u8/s8 for the next layer
  // directly; dw's result is also read by the residual Add and pw2's meets it, so they stay f32.
  // Without VNNI the depthwise dw runs in f32 (lower.cpp, make_int8) on c1's result, which c1
  // writes as f32 values on dw's input grid (Fused::requant_f32): no dequantizing step.
  const std::vector<std::string> plan = model.plan_summary({4, 3, 12, 12});
  INFO(joined(plan));
  CHECK(count_steps(plan, "conv int8 s8->u8") == (exact ? 1 : 0));
  CHECK(count_steps(plan, "conv int8 u8->f32") == (exact ? 1 : 0));
  CHECK(count_steps(plan, "conv int8 s8->s8") == 1);
  CHECK(count_steps(plan, "conv int8 s8->f32") == (exact ? 1 : 2));  // pw2 (and c1)
  CHECK(count_steps(plan, "conv ") == 4);
  CHECK(count_steps(plan, "inner_product int8 u8->f32") == 1);
  CHECK(count_steps(plan, "quantize ") == 3);  // the input, dw's result, the pooled features
  CHECK(count_steps(plan, "dequantize ") == 0);
  for (const std::string& line : plan) CHECK(line.find("ref:") == std::string::npos);
}

TEST_CASE("int8 Conv and Gemm on full-range inputs and weights do not saturate") {
  // Without VNNI, oneDNN's int8 kernels add pairs of u8 x s8 products in 16 bits, which saturate
  // at the ends of the ranges. Before dpar worked around it, the largest errors here were 80.6
  // (gemm_s8, oneDNN's inner product), 40.2 (gemm_u8) and 45.2 (conv3x3_u8), where the outputs
  // reach 81 to 92. Now each kernel with pairs of input channels runs on halved weights
  // (oneDNN's halving for s8 sources, dpar's for u8): at most one weight step per input, for
  // each output element (the fixture's halved_bound). With VNNI, and for depthwise convolutions
  // (no pairs; without VNNI computed in f32 on the dequantized input), the result is exact.
  // ctest also runs these cases with ONEDNN_MAX_CPU_ISA=AVX2, so that CPUs with VNNI test the
  // path without it.
  const bool vnni = exact_int8();
  struct Case {
    const char* name;
    Shape input;
    std::string step;  // its plan line's start
    bool pairs;        // more than one input channel per group
  };
  const std::string gemm_form = vnni ? "" : " as 1x1 conv";
  const std::string halved = vnni ? "" : " weights halved";
  for (const Case& c :
       {Case{"gemm_s8", {4, 64}, "inner_product int8 s8->f32" + gemm_form + " ", true},
        Case{"gemm_u8", {4, 64}, "inner_product int8 u8->f32" + gemm_form + halved + " ", true},
        Case{"conv3x3_u8", {4, 8, 5, 5}, "conv int8 u8->f32" + halved + " ", true},
        Case{"depthwise_u8", {4, 8, 5, 5}, vnni ? "conv int8 u8->f32 " : "conv ", false}}) {
    const std::string name = std::string("full_range_") + c.name;
    const parity::Fixture ref("infer_int8/" + name + ".safetensors");
    infer::Model model = infer::Model::load(model_path(name + ".onnx"));
    const std::vector<std::string> plan = model.plan_summary(c.input);
    INFO(name << "\n" << joined(plan));
    CHECK(count_steps(plan, c.step) == 1);
    // Without VNNI the depthwise case's input is quantized and dequantized, then convolved in
    // f32.
    const bool f32_depthwise = !vnni && !c.pairs;
    CHECK(count_steps(plan, "conv int8") + count_steps(plan, "inner_product int8") ==
          (f32_depthwise ? 0 : 1));
    CHECK(count_steps(plan, "dequantize ") == (f32_depthwise ? 1 : 0));
    for (const std::string& line : plan) CHECK(line.find("ref:") == std::string::npos);
    const bool exact = vnni || !c.pairs;
    const std::vector<float> y = model.run(ref["x"]).to_float_vector();
    const std::vector<float> want = ref["y"].to_float_vector();
    const std::vector<float> allowed = ref["halved_bound"].to_float_vector();
    REQUIRE(y.size() == want.size());
    REQUIRE(allowed.size() == want.size());
    const double exact_bound = 1e-5 * max_abs(ref["y"]);
    double err = 0, worst_share = 0;  // the largest error, and of its bound
    for (size_t i = 0; i < y.size(); ++i) {
      const double e = std::abs(double(y[i]) - double(want[i]));
      const double bound = exact ? exact_bound : 1.001 * allowed[i] + 1e-6;
      err = std::max(err, e);
      worst_share = std::max(worst_share, e / bound);
    }
    std::printf("%s (%s): max |dpar - reference| = %.3g of max |y| %.3g; %.2f of the bound\n",
                name.c_str(), exact ? "exact" : "halved weights", err, max_abs(ref["y"]),
                worst_share);
    CHECK(worst_share <= 1.0);
  }
}

TEST_CASE("MobileNetV3-small quantized by dpar's exporter agrees with the numpy QDQ reference") {
  // The torchvision weights (BN statistics perturbed) of the export fixtures, at 32 px.
  const parity::Fixture weights("export_small_state.safetensors");
  manual_seed(0);
  auto net = models::mobilenet_v3_small(10);
  net->load_state_dict(weights.entries(), /*strict=*/true);
  net->eval();
  io::OnnxExportOptions options;
  options.model_name = "mobilenet_v3_small";
  options.height = options.width = 32;
  options.softmax = false;
  options.write_json = false;
  Generator gen(5);
  auto batch = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n * 3 * 32 * 32));
    for (float& x : v) x = gen.normal();
    return Tensor::from_vector(v, {n, 3, 32, 32});
  };
  io::QuantizeResult q;
  options.graph_pass = [&](io::OnnxGraph& g) {
    io::OnnxCalibrator calib(g);
    for (int i = 0; i < 4; ++i) calib.observe(batch(8));
    q = io::quantize_qdq(g, calib);
  };
  options.metadata["precision"] = "int8";
  const fs::path dir = fs::temp_directory_path() / ("dpar_test_int8_" + std::to_string(getpid()));
  const auto r = models::export_mobilenet_v3(*net, dir.string(), options);
  CHECK(q.quantized_nodes == 54);
  CHECK(r.op_counts.at("QuantizeLinear") == 54);
  CHECK(r.op_counts.at("DequantizeLinear") == 108);

  infer::Model model = infer::Model::load(r.model_path);
  CHECK(model.info().precision == "int8");
  CHECK(model.info().metadata.at("precision") == "int8");
  const Tensor x = batch(6);
  const Tensor y = model.run(x);
  const std::string io_path = (dir / "io.safetensors").string();
  io::save_safetensors(io_path, {{"x", x}, {"y", y}});
  const bool exact = exact_int8();
  const std::string cmd = std::string(DPAR_PYTHON) + " " + DPAR_PARITY_SCRIPTS +
                          "/qdq_eval.py --model '" + r.model_path + "' --io '" + io_path + "'" +
                          (exact ? "" : " --approximate");
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  CHECK(std::system(cmd.c_str()) == 0);

  const std::vector<std::string> plan = model.plan_summary({1, 3, 32, 32});
  INFO(joined(plan));
  // Without VNNI the 11 depthwise convolutions run in f32, on f32 values their producers write
  // on their input grids: no dequantizing step.
  CHECK(count_steps(plan, "conv int8 ") == (exact ? 52 : 41));
  CHECK(count_steps(plan, "inner_product int8 ") == 2);
  CHECK(count_steps(plan, "conv ") == 52);  // no other f32 convolution
  CHECK(count_steps(plan, "dequantize ") == 0);
  // The SE blocks' Mul writes the integers of the int8 projection after it (requantisation).
  CHECK(count_steps(plan, "binary ") == 9);
  for (const std::string& line : plan) CHECK(line.find("ref:") == std::string::npos);
  for (const std::string& line : plan) {
    if (line.rfind("binary ", 0) == 0) {
      CHECK((line.find(":s8 ") != std::string::npos || line.find(":u8 ") != std::string::npos));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("a QDQ pair dpar cannot run in int8 is an error naming the node") {
  const std::string bad = model_path("unsupported.onnx");
  const std::string e = error_of([&] { infer::Model::load(bad); });
  INFO(e);
  CHECK(e.rfind(bad + ": Sigmoid 'sig' has a QuantizeLinear/DequantizeLinear pair", 0) == 0);
  CHECK(e.find("no int8 kernel") != std::string::npos);

  const std::string zp = model_path("zero_point.onnx");
  const std::string e2 = error_of([&] { infer::Model::load(zp); });
  INFO(e2);
  CHECK(e2.rfind(zp + ": QuantizeLinear 'x/Q': zero point 3", 0) == 0);
}

}  // namespace
