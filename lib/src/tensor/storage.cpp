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

}  // namespace dpar
