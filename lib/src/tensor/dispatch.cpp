#include "tensor/dispatch.h"

#include <mutex>

namespace dpar::detail {

void ensure_backends_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_cpu_backend();
#ifdef DPAR_WITH_CUDA
    register_cuda_backend();
#endif
  });
}

}  // namespace dpar::detail
