#include "infer_report.h"

#include <cstdio>

#include "dpar/core/device.h"
#include "dpar/core/sysinfo.h"
#include "dpar/core/version.h"
#include "dpar/infer/runtime.h"

namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string section(const std::string& title) {
  return "----------------------- " + title + " -----------------------\n";
}

std::string item(const std::string& key, const std::string& value) {
  return " " + key + ": " + value + "\n";
}

}  // namespace

std::string format_prob(double p) { return fixed(p, 6); }

std::string benchmark_report(const ReportFacts& f) {
  // CPU inference uses no CUDA libraries even in a CUDA build, so those facts are "not used"
  // rather than versions that played no part in the figures below.
  const bool gpu = !f.gpu_device.empty();
  const dpar::CudaDeviceInfo cuda =
      gpu ? dpar::cuda_device_info(dpar::Device::parse(f.gpu_device)) : dpar::CudaDeviceInfo{};
  std::string r;
  r += section("Env info");
  r += item("OS_version", dpar::sysinfo::os_name());
  r += item("CPU", dpar::sysinfo::cpu_model() + " (" + std::to_string(dpar::sysinfo::cpu_cores()) +
                       " cores)");
  r += item("CUDA_version", gpu ? cuda.runtime_version : "not used");
  r += item("CUDNN_version", gpu ? cuda.cudnn_version : "not used");
  r += item("driver_version", gpu ? cuda.driver_version : "not used");
  if (gpu) r += item("GPU", cuda.name + " (" + fixed(cuda.memory_gib, 1) + " GiB)");
  r += section("dpar info");
  r += item("dpar_version", dpar::version());
  r += item("dpar_commit", dpar::git_commit());
  r += item("log_api_version", "1.0");
  r += section("Conf info");
  r += item("runtime_device", gpu ? "gpu" : "cpu");
  r += item("ir_optim", "True");
  r += item("enable_memory_optim", "True");
  r += item("enable_tensorrt", "False");
  r += item("enable_mkldnn", gpu ? "False" : "True");
  r += item("mkldnn_version", "oneDNN " + dpar::infer::onednn_version());
  r += item("cpu_math_library_num_threads", std::to_string(f.threads));
  r += section("Model info");
  r += item("model_name", f.model_name);
  r += item("precision", f.precision);
  r += section("Data info");
  r += item("batch_size", std::to_string(f.batch_size));
  std::string shape;
  for (size_t i = 0; i < f.input_shape.size(); ++i) {
    if (i) shape += ",";  // (+= per piece: GCC 12 warns falsely on "," + to_string at -O3)
    shape += std::to_string(f.input_shape[i]);
  }
  r += item("input_shape", shape);
  r += item("data_num", std::to_string(f.images));
  r += section("Perf info");
  // GPU utilisation would need NVML, which dpar does not link: it stays None.
  r += " cpu_rss(MB): " + fixed(dpar::sysinfo::peak_rss_mb(), 4) +
       ", gpu_rss(MB): " + (gpu ? fixed(f.gpu_peak_mb, 4) : std::string("None")) +
       ", gpu_util: None%\n";
  r += item("total time spent(s)", fixed(f.total_s, 4));
  r += " preprocess_time(ms): " + fixed(f.preprocess_ms, 4) +
       ", inference_time(ms): " + fixed(f.inference_ms, 4) +
       ", postprocess_time(ms): " + fixed(f.postprocess_ms, 4) + "\n";
  return r;
}
