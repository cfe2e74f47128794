#include "dpar/tensor/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "dpar/core/error.h"
#include "tensor/dispatch.h"

namespace dpar {
namespace {

// CPU caching allocator. Training repeats the same shapes every step, so freed blocks are kept
// for the next request: after the first step nothing reaches malloc, and no page is faulted in
// again. A request takes the smallest cached block that fits with at most kSlack of its size to
// spare (best fit), not only one of its exact size: layers of different shapes then share the
// memory one of them freed, which keeps what the cache holds near the peak actually in use
// (with exact sizes only, MobileNetV3's training step held ~30% more). Blocks of 2 MiB and more
// start on a 2 MiB boundary and ask for transparent huge pages (madvise: Linux's default mode
// backs only memory that asks): streaming ops and oneDNN's packing then miss the TLB far less
// (ViT-Tiny's training step ~1.5% faster on one core). Only the block's whole 2 MiB pages are
// advised, so no huge page reaches past its end; the tail stays on 4 KiB pages.
class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override { empty_cache(); }

  void* allocate(size_t nbytes, Device /*device*/) override {
    const size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    size_t block = size;
    auto it = free_blocks_.lower_bound(size);
    if (it != free_blocks_.end() && it->first - size <= static_cast<size_t>(kSlack * size)) {
      block = it->first;
      p = it->second;
      free_blocks_.erase(it);
      stats_.cached_bytes -= block;
    } else {
      trim_for(size);
      p = system_allocate(size);
      if (!p) {
        DPAR_FAIL("cpu allocator: out of memory allocating ", nbytes, " bytes (",
                  stats_.allocated_bytes, " bytes in use, ", stats_.cached_bytes, " cached)");
      }
      ++stats_.system_allocations;
    }
    block_sizes_[p] = block;
    stats_.allocated_bytes += block;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = block_sizes_.find(ptr);
    DPAR_CHECK(it != block_sizes_.end(), "cpu allocator: freeing ", nbytes,
               " bytes at an address it did not hand out");
    const size_t block = it->second;
    block_sizes_.erase(it);
    stats_.allocated_bytes -= block;
    stats_.cached_bytes += block;
    // After the cached blocks of its size, so allocate() hands out the one freed longest ago:
    // writing over lines still in cache measured slower here (GELU's backward on ViT-Tiny, one
    // core, 17.5 -> 22 ms per step when the newest block came first).
    free_blocks_.emplace(block, ptr);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, p] : free_blocks_) system_free(p, size);
    free_blocks_.clear();
    stats_.cached_bytes = 0;
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
  static constexpr size_t kHugePage = size_t{2} << 20;
  static size_t round_up(size_t n) {
    return n == 0 ? kAlignment : (n + kAlignment - 1) / kAlignment * kAlignment;
  }

  // Before a block comes from the system: returns cached blocks (the largest first) while what
  // the allocator would then hold exceeds kHoldFactor times the most ever in use at once. A
  // step's forward, recomputation and backward ask for many sizes; without a bound the cache
  // keeps a block of every size it ever saw (MobileNetV3-small's training step held 227 MB for
  // a peak of 140 MB in use). In the steady state every request is served from the cache and
  // nothing is returned.
  void trim_for(size_t size) {
    const size_t in_use = stats_.allocated_bytes + size;
    const size_t limit = static_cast<size_t>(
        kHoldFactor * static_cast<double>(std::max(stats_.peak_allocated_bytes, in_use)));
    while (!free_blocks_.empty() && in_use + stats_.cached_bytes > limit) {
      auto largest = std::prev(free_blocks_.end());
      system_free(largest->second, largest->first);
      stats_.cached_bytes -= largest->first;
      free_blocks_.erase(largest);
    }
  }

  // Blocks from kMapped bytes are mapped and unmapped directly rather than through malloc:
  // glibc raises its mmap threshold after such a free and then keeps later blocks of that size
  // in its heap, where a trimmed block stays resident. Mapped, a returned block leaves the
  // process's resident size at once.
  static void* system_allocate(size_t size) {
    if (size < kMapped) {
      void* p = nullptr;
      // posix_memalign, not aligned_alloc: the size need not be a multiple of the alignment
      // (C11 requires that of aligned_alloc, and ASan enforces it).
      return ::posix_memalign(&p, kAlignment, size) == 0 ? p : nullptr;
    }
    const bool huge = size >= kHugePage;
    const size_t length = page_round(size), align = huge ? kHugePage : kPage;
    const size_t reserve = length + align - kPage;
    void* raw =
        ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    auto* base = static_cast<uint8_t*>(raw);
    auto* start =
        reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + align - 1) / align * align);
    if (start > base) ::munmap(base, static_cast<size_t>(start - base));
    if (uint8_t* end = start + length; end < base + reserve) {
      ::munmap(end, static_cast<size_t>(base + reserve - end));
    }
#ifdef MADV_HUGEPAGE
    if (huge) ::madvise(start, length / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
    return start;
  }
  static void system_free(void* p, size_t size) {
    if (size < kMapped) {
      std::free(p);
    } else {
      ::munmap(p, page_round(size));
    }
  }
  static size_t page_round(size_t n) { return (n + kPage - 1) / kPage * kPage; }

  static constexpr size_t kPage = 4096;
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer every block goes through malloc, which it guards with red zones.
  static constexpr size_t kMapped = SIZE_MAX;
#else
  static constexpr size_t kMapped = 256 << 10;
#endif
  static constexpr double kHoldFactor = 1.4;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;       // cached blocks by size
  std::unordered_map<void*, size_t> block_sizes_;  // handed-out blocks: their real size
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
