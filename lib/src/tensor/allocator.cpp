#include "dpar/tensor/allocator.h"

#include <array>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "dpar/core/error.h"
#include "tensor/dispatch.h"

namespace dpar {
namespace {

// CPU caching allocator. Training repeats the same shapes every step, so blocks are cached
// by their exact (64-byte rounded) size: after the first step nothing reaches malloc.
class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override { empty_cache(); }

  void* allocate(size_t nbytes) override {
    const size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated_bytes += size;
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes) {
      stats_.peak_allocated_bytes = stats_.allocated_bytes;
    }
    auto it = free_blocks_.find(size);
    if (it != free_blocks_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= size;
      return p;
    }
    void* p = std::aligned_alloc(kAlignment, size);
    if (!p) {
      stats_.allocated_bytes -= size;
      DPAR_FAIL("cpu allocator: out of memory allocating ", nbytes, " bytes (",
                stats_.allocated_bytes, " bytes in use, ", stats_.cached_bytes, " cached)");
    }
    ++stats_.system_allocations;
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    const size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated_bytes -= size;
    stats_.cached_bytes += size;
    free_blocks_[size].push_back(ptr);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : free_blocks_) {
      for (void* p : blocks) std::free(p);
    }
    free_blocks_.clear();
    stats_.cached_bytes = 0;
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  static constexpr size_t kAlignment = 64;  // a cache line; oneDNN prefers 64-byte alignment
  static size_t round_up(size_t n) {
    return n == 0 ? kAlignment : (n + kAlignment - 1) / kAlignment * kAlignment;
  }

  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;
  AllocatorStats stats_;
};

std::array<Allocator*, kNumDeviceTypes>& allocator_table() {
  static std::array<Allocator*, kNumDeviceTypes> table{};
  return table;
}

}  // namespace

Allocator& allocator_for(Device device) {
  detail::ensure_backends_registered();
  Allocator* a = allocator_table()[static_cast<int>(device.type)];
  DPAR_CHECK(a != nullptr, "no allocator for device ", device.str(),
             built_with_cuda() ? "" : " (dpar was built without CUDA)");
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  allocator_table()[static_cast<int>(type)] = allocator;
}

namespace detail {
Allocator* cpu_caching_allocator() {
  static auto* allocator = new CpuCachingAllocator();  // lives for the whole process
  return allocator;
}
}  // namespace detail

}  // namespace dpar
