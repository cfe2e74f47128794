#include "dpar/tensor/storage.h"

#include "dpar/tensor/allocator.h"

namespace dpar {

Storage::Storage(size_t nbytes, Device device)
    : nbytes_(nbytes), device_(device), from_allocator_(true) {
  data_ = allocator_for(device).allocate(nbytes, device);
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter,
                 bool pinned)
    : data_(data),
      nbytes_(nbytes),
      device_(device),
      pinned_(pinned),
      deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (from_allocator_) {
    allocator_for(device_).deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

void Storage::set_pending_write(std::function<void()> finish) {
  finish_pending_write();
  std::lock_guard<std::mutex> lock(pending_mutex_);
  finish_ = std::move(finish);
  pending_.store(finish_ != nullptr, std::memory_order_release);
}

void Storage::finish_pending_write() {
  if (!has_pending_write()) return;
  std::lock_guard<std::mutex> lock(pending_mutex_);
  if (!finish_) return;  // another thread finished it while this one waited for the lock
  // Taken out before it runs, and the gate opens however it ends: a failed write is reported
  // once, not again to every later reader (threads blocked on the lock meanwhile find it done).
  std::function<void()> finish = std::move(finish_);
  finish_ = nullptr;
  struct Open {
    std::atomic<bool>& pending;
    ~Open() { pending.store(false, std::memory_order_release); }
  } open{pending_};
  finish();
}

std::shared_ptr<Storage> Storage::alias(const std::shared_ptr<Storage>& storage) {
  return std::make_shared<Storage>(
      storage->data(), storage->nbytes(), storage->device(),
      [keep = storage](void*) mutable { keep.reset(); }, storage->pinned());
}

}  // namespace dpar
