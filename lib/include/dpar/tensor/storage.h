#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>

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
  // Whether dpar's allocator gave this memory (not wrapped from elsewhere: a libtorch tensor,
  // a user's buffer, an alias).
  bool from_allocator() const { return from_allocator_; }

  // ---- a pending asynchronous write --------------------------------------------------------
  // Memory that a collective is still filling on another thread (DataParallel's all-gather of
  // updated parameter slices, overlapped with the next forward) is gated: the first
  // Tensor::raw_data() of any tensor on this storage, from any thread, runs `finish` (which
  // waits for the write and rethrows its failure) before the address is handed out, and the
  // gate then opens. The writer reaches the same memory through an alias() storage, which is
  // not gated. Set by one thread at a time; a second set finishes the first write first.
  void set_pending_write(std::function<void()> finish);
  bool has_pending_write() const { return pending_.load(std::memory_order_acquire); }
  // Runs the pending finish (if any) now. Called by raw_data(); callable directly to settle the
  // write at a known point (errors propagate, and the gate is open afterwards either way).
  void finish_pending_write();
  // A Storage over the same memory that keeps this one alive and is never gated: what an
  // asynchronous writer uses while this storage is gated.
  static std::shared_ptr<Storage> alias(const std::shared_ptr<Storage>& storage);

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool from_allocator_ = false;
  bool pinned_ = false;
  std::function<void(void*)> deleter_;
  std::atomic<bool> pending_{false};
  std::mutex pending_mutex_;  // held while finish_ runs: concurrent readers wait for it
  std::function<void()> finish_;
};

}  // namespace dpar
