#pragma once
// Errors that only a kernel can see (a bad class index inside a target tensor), reported
// without a host synchronisation per step: the kernel writes a small record in mapped pinned
// host memory, and the host looks at it after the next stream synchronisation (synchronize()
// in cuda_context.cpp calls raise_deferred_errors) and throws dpar::Error there. The kernel
// itself carries on and produces NaN, so nothing reads out of bounds in the meantime.
// Included by .cu files (report_error) and by host .cpp files (the host half only).
#include <cstdint>

namespace dpar::cuda {

// Which check failed; selects the message raise_deferred_errors prints. 0 means no error.
enum DeferredErrorCode : int {
  kNoDeferredError = 0,
  kCrossEntropyTargetOutOfRange = 1,  // value = the target, bound = the class count
  kIndexOutOfRange = 2,  // gather/index_select/embedding/nll_loss: value = index, bound = size
};

// One per device. Only the first report after a synchronisation is kept: later ones are most
// likely consequences of the same bad input.
struct DeferredError {
  int code;  // a DeferredErrorCode; set first, by atomicCAS, so one writer owns the record
  int reserved;
  long long value;  // the offending value
  long long bound;  // the exclusive upper bound it broke (the lower one is 0)
};

// The record of `device` as a device pointer for kernels (allocated on first use, never
// freed: kernels in flight may still write it at process exit).
DeferredError* deferred_error_record(int device);

// Called by the host right after a stream synchronisation of `device` succeeded: when a kernel
// reported an error since the last call, clears the record and throws dpar::Error naming the
// op and the offending value. Cheap when nothing was reported (one read of host memory).
void raise_deferred_errors(int device);

#ifdef __CUDACC__
// Records (code, value, bound) unless an earlier report is pending; safe from any number of
// threads at once. The plain read first keeps a flood of reports off the bus.
__device__ __forceinline__ void report_error(DeferredError* rec, int code, long long value,
                                             long long bound) {
  if (*static_cast<volatile int*>(&rec->code) != kNoDeferredError) return;
  if (atomicCAS(&rec->code, kNoDeferredError, code) == kNoDeferredError) {
    rec->value = value;
    rec->bound = bound;
    __threadfence_system();  // make the fields visible to the host with the code
  }
}
#endif

}  // namespace dpar::cuda
