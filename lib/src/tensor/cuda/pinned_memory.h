#pragma once
// Page-locked host memory for asynchronous host-to-device copies (see pinned_memory.cpp).
#include <cuda_runtime.h>

#include <memory>

#include "dpar/tensor/storage.h"
#include "dpar/tensor/tensor.h"

namespace dpar::cuda {

// A pinned CPU Storage of nbytes from the cache (cudaHostAlloc on a miss).
std::shared_ptr<Storage> alloc_pinned(size_t nbytes);
// The pinned block starting at `block` is read by work queued on `stream`: when its Storage
// dies, the block is reused only after that work has completed. Ignores other pointers.
void record_pinned_use(void* block, cudaStream_t stream);
// Tensor::to(device, non_blocking) for a dense pinned source (the to_device_async slot).
Tensor to_device_async(const Tensor& src, Device target);

}  // namespace dpar::cuda
