// dpar::infer on the GPU: an exported MobileNetV3-small (statistics and biases perturbed, logits
// out) gives the CPU runtime's answer (oneDNN plan) within 1e-4, from CPU or device inputs, at
// several batch sizes.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dpar/infer/runtime.h"
#include "dpar/io/onnx_export.h"
#include "gpu/gpu_helpers.h"
#include "mobilenetv3/model/mobilenet_v3.h"
#include "mobilenetv3/model/mobilenet_v3_onnx.h"
#include "model_perturb.h"

using namespace dpar;

namespace {

// The values of t in logical order as raw little-endian f32, with its shape on a first line of
// a sibling .shape file.
void write_floats(const std::string& path, const Tensor& t) {
  const std::vector<float> v = t.to_float_vector();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()),
             static_cast<std::streamsize>(v.size() * sizeof(float)));
  std::ofstream shape(path + ".shape");
  for (int64_t d : t.shape()) shape << d << " ";
  shape << "\n";
}

}  // namespace

TEST_CASE("an exported MobileNetV3-small runs on the GPU like on the CPU") {
  DPAR_REQUIRE_GPU();
  manual_seed(3);
  auto net = models::mobilenet_v3("mobilenet_v3_small", 10);
  testing::perturb_model(*net);  // at init the outputs are constant (model_perturb.h)
  net->eval();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dpar_gpu_infer_" + std::to_string(::getpid())))
          .string();
  io::OnnxExportOptions options;
  options.model_name = "mobilenet_v3_small";
  options.height = options.width = 64;
  options.softmax = false;  // logits: probabilities can saturate and hide differences
  models::export_mobilenet_v3(*net, dir, options);
  infer::Model cpu = infer::Model::load(dir + "/inference.onnx");
  infer::Model gpu = infer::Model::load(dir + "/inference.onnx");
  gpu.set_device(kGpu);
  CHECK(gpu.device() == kGpu);
  // DPAR_INFER_PARITY_DIR: also leave the model, the batch-8 input and both outputs there, for
  // tests/gpu/onnxruntime_parity.py to hold against onnxruntime.
  const char* parity_dir = std::getenv("DPAR_INFER_PARITY_DIR");
  for (int64_t batch : {1, 8}) {
    const Tensor x = random_tensor({batch, 3, 64, 64}, 11 + static_cast<uint64_t>(batch));
    const Tensor want = cpu.run(x);
    const Tensor got = gpu.run(x);
    CHECK(got.device() == kGpu);
    CHECK(relative_error(want, got) <= 1e-4);
    CHECK(relative_error(want, gpu.run(x.to(kGpu))) <= 1e-4);  // a device input
    if (parity_dir != nullptr && batch == 8) {
      std::filesystem::create_directories(parity_dir);
      std::filesystem::copy_file(dir + "/inference.onnx",
                                 std::string(parity_dir) + "/inference.onnx",
                                 std::filesystem::copy_options::overwrite_existing);
      write_floats(std::string(parity_dir) + "/input.f32", x);
      write_floats(std::string(parity_dir) + "/cpu_output.f32", want);
      write_floats(std::string(parity_dir) + "/gpu_output.f32", got);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("fp16 inference on the GPU stays within half precision of fp32") {
  DPAR_REQUIRE_GPU();
  manual_seed(4);
  auto net = models::mobilenet_v3("mobilenet_v3_small", 10);
  testing::perturb_model(*net);  // at init the outputs are constant (model_perturb.h)
  net->eval();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dpar_gpu_infer16_" + std::to_string(::getpid())))
          .string();
  io::OnnxExportOptions options;
  options.model_name = "mobilenet_v3_small";
  options.height = options.width = 64;
  options.softmax = false;  // logits: probabilities can saturate and hide differences
  models::export_mobilenet_v3(*net, dir, options);
  infer::Model fp32 = infer::Model::load(dir + "/inference.onnx");
  infer::Model fp16 = infer::Model::load(dir + "/inference.onnx");
  fp16.set_device(kGpu, DType::f16);
  CHECK(fp16.compute_dtype() == DType::f16);
  const Tensor x = random_tensor({4, 3, 64, 64}, 21);
  // Through ~50 layers f16 rounding (2^-11) accumulates: a stated bound of 2e-2 relative.
  CHECK(relative_error(fp32.run(x), fp16.run(x)) <= 2e-2);
  std::filesystem::remove_all(dir);
}
