#pragma once
// Host-side plumbing shared by every CUDA kernel family: error checks that name the op, the
// current stream of each device, a device guard, launch-size helpers, and the cuBLAS/cuDNN
// handles bound to the current stream. Included by .cu and .cpp files of tensor/cuda/ only.
#include <cuda_runtime.h>

#include <cstdint>

#include "dpar/core/device.h"
#include "dpar/core/error.h"

namespace dpar::cuda {

// Throws dpar::Error "CUDA error in <what> (last kernel <k>): <reason>" unless status is success.
void check(cudaError_t status, const char* what);
// Checks the launch of the kernel just issued (cudaGetLastError).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// The stream every kernel of this thread runs on for `device` (created on first use, one per
// device, non-blocking so it never serialises against the legacy default stream).
cudaStream_t current_stream(int device);
cudaStream_t current_stream();  // of the current device
// A high-priority non-blocking stream for collectives on `device`, from a per-device pool of a
// few handed out in turn (so two process groups rarely share one and cannot order each other's
// collectives). Never destroyed: memory allocated on a communication stream or recorded on it
// (record_stream) is freed on it, which can happen long after the group that used it is gone.
cudaStream_t communication_stream(int device);
// Makes `stream` current for `device` on this thread until the guard goes out of scope (side
// streams: data copies, communication).
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// Makes `device` current (cudaSetDevice) for the scope; restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Waits for all work queued on the current device, if this process used a GPU (the profiler's
// device wait, see profiler::set_device_sync).
void wait_for_device_work();

// Waits for the current stream of `device`; turns an asynchronous kernel fault into a
// dpar::Error naming the last kernel launched.
void synchronize(int device);

// Threads per block for the 1-D kernels and the grid that covers n elements (capped; kernels
// use grid-stride loops).
inline constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

// The name of the last kernel slot dispatched to CUDA on this thread (for error messages).
const char* last_kernel();

}  // namespace dpar::cuda
