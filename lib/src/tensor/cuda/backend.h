#pragma once
// What libdpar_cuda gives libdpar: the functions behind the backend table (core/cuda_backend.h,
// filled in backend_entry.cpp). libdpar's public device queries (dpar/core/device.h) and its
// NCCL groups reach them only through that table, once libdpar has loaded this library.
#include <memory>
#include <string>

#include "dpar/core/device.h"
#include "dpar/distributed/process_group.h"

namespace dpar::cuda {

// Fills the CUDA kernel slots and registers the CUDA allocator (register.cpp).
void register_backend();

// The device queries (cuda_context.cpp), as dpar/core/device.h documents them.
int device_count();
std::string unavailable_reason();
void synchronize_device(Device device);
CudaDeviceInfo device_info(Device device);
void set_profiler_capture(bool capture);

// The NCCL process group (distributed/nccl/process_group_nccl.cpp).
std::shared_ptr<dist::ProcessGroup> make_nccl_group(std::shared_ptr<dist::Store> store, int rank,
                                                    int size,
                                                    const dist::ProcessGroupOptions& options);

}  // namespace dpar::cuda
