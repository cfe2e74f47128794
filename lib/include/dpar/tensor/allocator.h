#pragma once
// Per-device allocators. Tensors never call malloc/cudaMalloc directly: they ask the allocator
// registered for their device, which caches freed blocks by size so that the steady state of
// a training loop allocates nothing from the system.
#include <cstddef>
#include <cstdint>

#include "dpar/core/device.h"

namespace dpar {

struct AllocatorStats {
  size_t allocated_bytes = 0;       // currently handed out
  size_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes
  size_t cached_bytes = 0;          // freed blocks kept for reuse
  uint64_t system_allocations = 0;  // calls that reached the system allocator
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `device` is the tensor's device; an allocator for several devices of one type (CUDA)
  // allocates there whatever device is current.
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual void empty_cache() = 0;  // return cached blocks to the system
  virtual AllocatorStats stats() const = 0;
  // Starts a new high-water mark at what is allocated now (torch.cuda.reset_peak_memory_stats),
  // so a benchmark can report the peak of one phase.
  virtual void reset_peak_stats() = 0;
};

// The allocator for a device type; throws dpar::Error when the backend is not built.
Allocator& allocator_for(Device device);
// Backends install their allocator at registration time (see tensor/dispatch.h).
void register_allocator(DeviceType type, Allocator* allocator);

}  // namespace dpar
