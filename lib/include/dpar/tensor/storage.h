#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "dpar/core/device.h"

namespace dpar {

// A refcounted block of device memory. Tensors and views share one Storage through
// std::shared_ptr; the block goes back to its allocator when the last user is gone.
class Storage {
 public:
  // Allocates nbytes on device from that device's allocator.
  Storage(size_t nbytes, Device device);
  // Wraps memory owned elsewhere; deleter runs when the Storage dies (may be empty). pinned:
  // page-locked host memory (CPU storage the GPU can copy from without staging).
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter,
          bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool from_allocator_ = false;
  bool pinned_ = false;
  std::function<void(void*)> deleter_;
};

}  // namespace dpar
