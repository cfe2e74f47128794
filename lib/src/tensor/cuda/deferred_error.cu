// The per-device deferred error records (see deferred_error.h): mapped pinned host memory,
// so that a kernel writes it directly and the host reads it without a copy or a sync of its own.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "dpar/core/error.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/deferred_error.h"

namespace dpar::cuda {
namespace {

constexpr int kMaxDevices = 64;  // as in cuda_context.cpp

struct Records {
  std::mutex mutex;  // allocation, and reading+clearing a record
  // Host addresses, published (release) after the device address is stored.
  std::array<std::atomic<DeferredError*>, kMaxDevices> host{};
  std::array<DeferredError*, kMaxDevices> device{};
};

Records& records() {
  static Records* r = new Records();  // leaked: records outlive every kernel
  return *r;
}

void check_index(int device) {
  DPAR_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index ", device, " out of range");
}

std::string describe(int code, long long value, long long bound) {
  switch (code) {
    case kCrossEntropyTargetOutOfRange:
      return detail::str_cat("cross_entropy: target ", value, " is outside [0, ", bound, ")");
    case kIndexOutOfRange:
      return detail::str_cat("gather/index_select/embedding/nll_loss: index ", value,
                             " is outside [0, ", bound, ")");
    default:
      return detail::str_cat("a CUDA kernel reported error code ", code, " (value ", value,
                             ", bound ", bound, ")");
  }
}

}  // namespace

DeferredError* deferred_error_record(int device) {
  check_index(device);
  Records& r = records();
  const size_t d = static_cast<size_t>(device);
  if (r.host[d].load(std::memory_order_acquire)) return r.device[d];
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.host[d].load(std::memory_order_relaxed)) return r.device[d];
  DeviceGuard guard(Device::cuda(device));
  void* host = nullptr;
  // Portable: any context may map it; Mapped: kernels address it through a device pointer.
  check(cudaHostAlloc(&host, sizeof(DeferredError), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc (deferred error record)");
  auto* rec = static_cast<DeferredError*>(host);
  *rec = DeferredError{kNoDeferredError, 0, 0, 0};
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
  r.device[d] = static_cast<DeferredError*>(dev);
  r.host[d].store(rec, std::memory_order_release);
  return r.device[d];
}

void raise_deferred_errors(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  Records& r = records();
  // volatile: the GPU writes this memory behind the compiler's back.
  volatile DeferredError* rec = r.host[static_cast<size_t>(device)].load(std::memory_order_acquire);
  if (!rec || rec->code == kNoDeferredError) return;  // never used, or nothing reported
  int code;
  long long value, bound;
  {
    std::lock_guard<std::mutex> lock(r.mutex);  // one thread reports it, once
    code = rec->code;
    if (code == kNoDeferredError) return;
    value = rec->value;
    bound = rec->bound;
    rec->value = 0;
    rec->bound = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    rec->code = kNoDeferredError;  // last: re-arms the record for later kernels
  }
  DPAR_FAIL(describe(code, value, bound), " (reported by the GPU on cuda:", device,
            " at the next synchronisation)");
}

}  // namespace dpar::cuda
