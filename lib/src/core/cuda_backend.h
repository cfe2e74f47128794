#pragma once
// The CUDA backend as libdpar sees it: a library of its own (libdpar_cuda, everything under
// tensor/cuda/ and distributed/nccl/, linked against cuBLAS, cuDNN and NCCL) that libdpar opens
// with dlopen the first time a CUDA device is used. A CPU process of a CUDA build therefore
// never maps the CUDA libraries (~217 MB resident when libdpar linked them directly), starts as
// fast as a CPU-only build, and runs on machines that have no NVIDIA libraries at all.
//
// libdpar_cuda exports one C function, dpar_cuda_backend_api(), returning the table below; every
// other crossing goes through the kernel slots and allocators that register_backend() fills.
#include <memory>
#include <string>

#include "dpar/core/device.h"

namespace dpar::dist {
class ProcessGroup;
class Store;
struct ProcessGroupOptions;
}  // namespace dpar::dist

namespace dpar::detail {

// Bumped whenever the table changes: a libdpar_cuda from another build is refused by name.
inline constexpr int kCudaBackendApiVersion = 1;

struct CudaBackendApi {
  int version;
  void (*register_backend)();  // fills the CUDA kernel slots and the CUDA allocator
  int (*device_count)();
  std::string (*unavailable_reason)();
  void (*synchronize)(Device);
  CudaDeviceInfo (*device_info)(Device);
  void (*set_profiler_capture)(bool);
  std::shared_ptr<dist::ProcessGroup> (*make_nccl_group)(std::shared_ptr<dist::Store> store,
                                                         int rank, int size,
                                                         const dist::ProcessGroupOptions& options);
};

// The backend, loaded and registered on the first call (thread-safe); nullptr when this build
// has none or it cannot be loaded, and then cuda_backend_error() says why in one line.
const CudaBackendApi* cuda_backend();
std::string cuda_backend_error();

// Whether the backend library is in this process (loaded by use or linked by the program), for
// tests that check a CPU run leaves it out.
bool cuda_backend_loaded();

}  // namespace dpar::detail

// The symbol libdpar looks up in libdpar_cuda.
extern "C" const dpar::detail::CudaBackendApi* dpar_cuda_backend_api();
