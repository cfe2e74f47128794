#include "dpar/core/device.h"

#include <cctype>

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

#ifndef DPAR_WITH_CUDA
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "dpar was built without CUDA"; }
void synchronize(Device) {}
std::string cuda_device_summary(Device) { return {}; }
void set_cuda_profiler_capture(bool) {}
CudaDeviceInfo cuda_device_info(Device) { return {}; }
#endif

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
