#pragma once
// Kernels every backend provides: copy between layouts/dtypes on one device, fill, and the
// host<->device transfer a non-CPU backend registers under its own device type.
#include <memory>

#include "dpar/tensor/storage.h"
#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

// dst and src have equal shapes and live on the same device; dtypes and strides may differ.
DPAR_KERNEL(copy, void(const Tensor& src, Tensor& dst));
DPAR_KERNEL(fill, void(Tensor& dst, double value));
// Adds 1 to every element of a dense i64 tensor in place (counters such as BatchNorm's
// num_batches_tracked), without reading it back to the host.
DPAR_KERNEL(count_up, void(Tensor& counter));
// Copies a dense tensor between the CPU and a device; registered under the device's type.
DPAR_KERNEL(copy_across_devices, void(const Tensor& src, Tensor& dst));
// Page-locked host memory of nbytes (a CPU Storage marked pinned), from the backend that can
// copy from it asynchronously; registered under that backend's device type.
DPAR_KERNEL(alloc_pinned, std::shared_ptr<Storage>(size_t nbytes));
// A copy of the dense pinned CPU tensor src on `target`, made on a side stream and ordered
// before the current stream's later work; registered under the target's device type.
DPAR_KERNEL(to_device_async, Tensor(const Tensor& src, Device target));

}  // namespace dpar::kernels
