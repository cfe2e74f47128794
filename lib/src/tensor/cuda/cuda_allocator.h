#pragma once
// The CUDA device allocator: stream-ordered (cudaMallocAsync on each device's memory pool,
// which caches freed memory instead of returning it), so that a block freed by work on one
// stream is handed to another stream only after an event says the first is done with it.
#include <cuda_runtime.h>

#include "dpar/tensor/allocator.h"

namespace dpar::cuda {

Allocator* device_allocator();

// Marks the block at `ptr` (from device_allocator) as used by work on `stream` too (record-stream
// semantics): when the tensor dies, the block is freed only after that work completes. Use
// for tensors a collective or a side-stream copy reads after their last owner let go.
void record_stream(void* ptr, cudaStream_t stream);

}  // namespace dpar::cuda
