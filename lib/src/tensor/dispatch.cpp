#include "tensor/dispatch.h"

#include <mutex>

#include "core/cuda_backend.h"

namespace dpar::detail {

void ensure_backends_registered() {
  static std::once_flag once;
  std::call_once(once, [] { register_cpu_backend(); });
}

bool ensure_cuda_backend() { return cuda_backend() != nullptr; }

std::string missing_backend_note(Device device) {
  if (device.is_cpu() || ensure_cuda_backend()) return "";
  return " (" + cuda_backend_error() + ")";
}

}  // namespace dpar::detail
