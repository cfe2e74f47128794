#include "dpar/core/device.h"

#include <cctype>
#include <cstdio>

#include "core/cuda_backend.h"
#include "dpar/core/cuda_profiler.h"
#include "dpar/core/error.h"

namespace dpar {

Device Device::parse(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "cpu") return cpu();
  for (const std::string prefix : {"cuda", "gpu"}) {
    if (t == prefix) return cuda(0);
    if (t.rfind(prefix + ":", 0) == 0) {
      const std::string index = t.substr(prefix.size() + 1);
      DPAR_CHECK(!index.empty() && index.find_first_not_of("0123456789") == std::string::npos,
                 "device '", text, "': expected cpu, gpu, cuda or cuda:<index>");
      return cuda(std::stoi(index));
    }
  }
  DPAR_FAIL("device '", text, "': expected cpu, gpu, cuda or cuda:<index>");
}

bool built_with_cuda() {
#ifdef DPAR_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// The CUDA queries go to libdpar_cuda, loaded by the first of them (core/cuda_backend.h); where
// it is absent or cannot be loaded they answer as a machine without a GPU, and the reason is
// the load error.
int cuda_device_count() {
  const detail::CudaBackendApi* api = detail::cuda_backend();
  return api ? api->device_count() : 0;
}

std::string cuda_unavailable_reason() {
  const detail::CudaBackendApi* api = detail::cuda_backend();
  return api ? api->unavailable_reason() : detail::cuda_backend_error();
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
  const detail::CudaBackendApi* api = detail::cuda_backend();
  DPAR_CHECK(api != nullptr, "synchronize(", device.str(), "): ", detail::cuda_backend_error());
  api->synchronize(device);
}

CudaDeviceInfo cuda_device_info(Device device) {
  if (device.is_cpu()) return {};
  const detail::CudaBackendApi* api = detail::cuda_backend();
  return api ? api->device_info(device) : CudaDeviceInfo{};
}

std::string cuda_device_summary(Device device) {
  const CudaDeviceInfo info = cuda_device_info(device);
  if (info.name.empty()) return {};
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB", info.memory_gib);
  return "CUDA runtime " + info.runtime_version + ", driver " + info.driver_version + ", cuDNN " +
         info.cudnn_version + ", " + info.name + ", " + memory;
}

void set_cuda_profiler_capture(bool capture) {
  if (const detail::CudaBackendApi* api = detail::cuda_backend())
    api->set_profiler_capture(capture);
}

void check_device_available(Device device) {
  if (device.is_cpu()) return;
  const int count = cuda_device_count();
  if (count == 0)
    DPAR_FAIL("device ", device.str(), " is not available: ", cuda_unavailable_reason());
  DPAR_CHECK(device.index >= 0 && device.index < count, "device ", device.str(),
             " is not available: this process sees ", count, " CUDA device", count == 1 ? "" : "s",
             " (cuda:0", count > 1 ? "..cuda:" + std::to_string(count - 1) : "", ")");
}

}  // namespace dpar
