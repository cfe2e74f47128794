// The one symbol libdpar looks up after it opens libdpar_cuda (core/cuda_backend.cpp).
#include "core/cuda_backend.h"
#include "tensor/cuda/backend.h"

extern "C" const dpar::detail::CudaBackendApi* dpar_cuda_backend_api() {
  static const dpar::detail::CudaBackendApi api{
      .version = dpar::detail::kCudaBackendApiVersion,
      .register_backend = &dpar::cuda::register_backend,
      .device_count = &dpar::cuda::device_count,
      .unavailable_reason = &dpar::cuda::unavailable_reason,
      .synchronize = &dpar::cuda::synchronize_device,
      .device_info = &dpar::cuda::device_info,
      .set_profiler_capture = &dpar::cuda::set_profiler_capture,
      .make_nccl_group = &dpar::cuda::make_nccl_group,
  };
  return &api;
}
