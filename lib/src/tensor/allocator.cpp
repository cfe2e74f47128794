#include "dpar/tensor/allocator.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "dpar/core/error.h"
#include "tensor/cpu_segment_arena.h"
#include "tensor/dispatch.h"

namespace dpar {
namespace {

// CPU caching allocator. Training repeats the same shapes every step, so freed blocks are kept
// for the next request: after the first step nothing reaches the system, and no page is faulted
// in again. Blocks from kMapped bytes come from reserved address ranges where they are split and
// merged and only their pages are mapped (detail::SegmentArena), so layers of different shapes
// share the memory another freed. Smaller ones come from malloc, and a request takes the smallest
// cached one that fits with at most kSlack of its size to spare (best fit), not only one of its
// exact size (with exact sizes only, MobileNetV3's training step held ~30% more).
class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override { empty_cache(); }

  void* allocate(size_t nbytes, Device /*device*/) override {
    const size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    size_t block = size;
    if (size >= kMapped) {
      p = arena_.take_cached(size, block);
      if (!p) {
        trim_for(detail::SegmentArena::block_size_for(size));
        p = arena_.take_new(size, block);
        if (!p) fail_out_of_memory(nbytes);
        ++stats_.system_allocations;
      }
      stats_.allocated_bytes += block;
      stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
      update_cached();
      return p;
    }
    auto it = free_blocks_.lower_bound(size);
    if (it != free_blocks_.end() && it->first - size <= static_cast<size_t>(kSlack * size)) {
      block = it->first;
      p = it->second;
      free_blocks_.erase(it);
      small_cached_bytes_ -= block;
    } else {
      trim_for(size);
      // posix_memalign, not aligned_alloc: the size need not be a multiple of the alignment
      // (C11 requires that of aligned_alloc, and ASan enforces it).
      if (::posix_memalign(&p, kAlignment, size) != 0) fail_out_of_memory(nbytes);
      ++stats_.system_allocations;
    }
    block_sizes_[p] = block;
    stats_.allocated_bytes += block;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    update_cached();
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (arena_.owns(ptr)) {
      stats_.allocated_bytes -= arena_.give_back(ptr);
      update_cached();
      return;
    }
    auto it = block_sizes_.find(ptr);
    DPAR_CHECK(it != block_sizes_.end(), "cpu allocator: freeing ", nbytes,
               " bytes at an address it did not hand out");
    const size_t block = it->second;
    block_sizes_.erase(it);
    stats_.allocated_bytes -= block;
    small_cached_bytes_ += block;
    update_cached();
    // After the cached blocks of its size, so allocate() hands out the one freed longest ago:
    // writing over lines still in cache measured slower here (GELU's backward on ViT-Tiny, one
    // core, 17.5 -> 22 ms per step when the newest block came first).
    free_blocks_.emplace(block, ptr);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, p] : free_blocks_) std::free(p);
    free_blocks_.clear();
    small_cached_bytes_ = 0;
    while (arena_.largest_free_block() > 0) arena_.release_largest_free_block();
    update_cached();
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  static constexpr size_t kAlignment = 64;  // a cache line; oneDNN prefers 64-byte alignment
  static constexpr double kSlack = 0.25;
  static size_t round_up(size_t n) {
    return n == 0 ? kAlignment : (n + kAlignment - 1) / kAlignment * kAlignment;
  }

  [[noreturn]] void fail_out_of_memory(size_t nbytes) const {
    DPAR_FAIL("cpu allocator: out of memory allocating ", nbytes, " bytes (",
              stats_.allocated_bytes, " bytes in use, ", stats_.cached_bytes, " cached)");
  }

  void update_cached() { stats_.cached_bytes = small_cached_bytes_ + arena_.free_bytes(); }

  // Before memory comes from the system (`size` bytes of it): returns cached memory, the
  // largest first (a large free block's pages or a small block), while what the allocator would
  // then hold exceeds kHoldFactor times the most ever in use at once. A step's forward,
  // recomputation and backward ask for many sizes; without a bound the cache keeps a block of
  // every size it ever saw (MobileNetV3-small's training step held 227 MB for a peak of 140
  // MB in use). In the steady state every request is served from the cache and nothing is
  // returned.
  void trim_for(size_t size) {
    const size_t in_use = stats_.allocated_bytes + size;
    const size_t limit = static_cast<size_t>(
        kHoldFactor * static_cast<double>(std::max(stats_.peak_allocated_bytes, in_use)));
    while (in_use + stats_.cached_bytes > limit) {
      const size_t large = arena_.largest_free_block();
      const size_t small = free_blocks_.empty() ? 0 : std::prev(free_blocks_.end())->first;
      if (large == 0 && small == 0) break;
      if (large >= small) {
        arena_.release_largest_free_block();
      } else {
        auto largest = std::prev(free_blocks_.end());
        std::free(largest->second);
        small_cached_bytes_ -= largest->first;
        free_blocks_.erase(largest);
      }
      update_cached();
    }
  }

#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer every block goes through malloc, which it guards with red zones.
  static constexpr size_t kMapped = SIZE_MAX;
#else
  static constexpr size_t kMapped = 256 << 10;
#endif
  static constexpr double kHoldFactor = 1.4;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;       // cached small blocks by size
  std::unordered_map<void*, size_t> block_sizes_;  // handed-out small blocks: their real size
  size_t small_cached_bytes_ = 0;
  detail::SegmentArena arena_;  // blocks from kMapped bytes
  AllocatorStats stats_;
};

std::array<Allocator*, kNumDeviceTypes>& allocator_table() {
  static std::array<Allocator*, kNumDeviceTypes> table{};
  return table;
}

}  // namespace

Allocator& allocator_for(Device device) {
  detail::ensure_backends_registered();
  if (device.type == DeviceType::CUDA) detail::ensure_cuda_backend();
  Allocator* a = allocator_table()[static_cast<int>(device.type)];
  DPAR_CHECK(a != nullptr, "no allocator for device ", device.str(),
             detail::missing_backend_note(device));
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
