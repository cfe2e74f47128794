// Stream-ordered CUDA allocator on cudaMallocAsync pools. Why not a hand-written caching
// allocator: the driver's pool already caches (release threshold = never), reuses memory
// across streams only behind the right events, and avoids cudaMalloc/cudaFree device syncs.
#include "tensor/cuda/cuda_allocator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cuda_context.h"

namespace dpar::cuda {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Block {
  int device = 0;
  size_t size = 0;
  cudaStream_t stream = nullptr;            // allocated on; freed on when nothing else used it
  std::vector<cudaStream_t> other_streams;  // record_stream()
};

class StreamOrderedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device where) override {
    // Ops allocate outputs before any kernel sets the device: allocate on the tensor's device,
    // not on whichever is current.
    DeviceGuard guard(where);
    const int device = where.index;
    configure_pool(device);
    cudaStream_t stream = current_stream(device);
    const size_t size = std::max<size_t>(nbytes, 1);
    void* p = nullptr;
    cudaError_t status = cudaMallocAsync(&p, size, stream);
    if (status == cudaErrorMemoryAllocation) {
      // Memory cached for other streams may be what is missing: wait for the device, give the
      // pool's unused memory back and try once more before reporting.
      (void)cudaGetLastError();
      (void)cudaDeviceSynchronize();
      cudaMemPool_t pool = nullptr;
      if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
      status = cudaMallocAsync(&p, size, stream);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      fail_out_of_memory(device, size);
    }
    check(status, "cudaMallocAsync");
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[p] = Block{device, size, stream, {}};
    stats_.allocated_bytes += size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    // As on the CPU, count the requests the pool could not serve from what it holds.
    uint64_t reserved = 0;
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
            cudaSuccess &&
        reserved > last_reserved_[static_cast<size_t>(device)]) {
      ++stats_.system_allocations;
    }
    last_reserved_[static_cast<size_t>(device)] = reserved;  // falls only after empty_cache
    return p;
  }

  void deallocate(void* ptr, size_t /*nbytes*/) override {
    if (!ptr) return;
    Block block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(ptr);
      if (it == blocks_.end()) return;
      block = std::move(it->second);
      blocks_.erase(it);
      stats_.allocated_bytes -= block.size;
    }
    // Called from destructors: never throws. Errors here (a faulted context, driver shutdown
    // at exit) surface at the next checked call instead.
    int previous = 0;
    (void)cudaGetDevice(&previous);
    if (previous != block.device) (void)cudaSetDevice(block.device);
    cudaStream_t free_stream = block.stream;
    if (!block.other_streams.empty()) {
      // Free on a release stream that waits for every stream that used the block, so neither
      // the compute nor the communication stream is held back by the other.
      free_stream = release_stream(block.device);
      block.other_streams.push_back(block.stream);
      for (cudaStream_t s : block.other_streams) {
        cudaEvent_t done = nullptr;
        if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) continue;
        (void)cudaEventRecord(done, s);
        (void)cudaStreamWaitEvent(free_stream, done, 0);
        (void)cudaEventDestroy(done);  // released once it has completed
      }
    }
    (void)cudaFreeAsync(ptr, free_stream);
    if (previous != block.device) (void)cudaSetDevice(previous);
  }

  void empty_cache() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) return;
    for (int d = 0; d < count; ++d) {
      if (!configured_[static_cast<size_t>(d)]) continue;
      DeviceGuard guard(Device::cuda(d));
      check(cudaDeviceSynchronize(), "empty_cache: cudaDeviceSynchronize");
      cudaMemPool_t pool = nullptr;
      check(cudaDeviceGetDefaultMemPool(&pool, d), "cudaDeviceGetDefaultMemPool");
      check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
    }
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }

  AllocatorStats stats() const override {
    AllocatorStats s;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      s = stats_;
    }
    const uint64_t reserved = reserved_bytes();
    s.cached_bytes = reserved > s.allocated_bytes ? reserved - s.allocated_bytes : 0;
    return s;
  }

  void record_stream(void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    DPAR_CHECK(it != blocks_.end(), "record_stream: pointer is not a dpar CUDA allocation");
    Block& b = it->second;
    if (stream == b.stream) return;
    if (std::find(b.other_streams.begin(), b.other_streams.end(), stream) ==
        b.other_streams.end()) {
      b.other_streams.push_back(stream);
    }
  }

 private:
  static constexpr size_t kMaxDevices = 64;

  void configure_pool(int device) {
    if (configured_[static_cast<size_t>(device)]) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (configured_[static_cast<size_t>(device)]) return;
    int supported = 0;
    check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device),
          "cudaDeviceGetAttribute(MemoryPoolsSupported)");
    DPAR_CHECK(supported, "CUDA device ", device,
               " does not support stream-ordered memory pools (cudaMallocAsync)");
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
    // Keep freed memory in the pool across synchronisations (the default returns it to the
    // driver at every sync, which would make every step pay for cudaMalloc again).
    uint64_t threshold = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
    configured_[static_cast<size_t>(device)] = true;
  }

  cudaStream_t release_stream(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    cudaStream_t& s = release_streams_[static_cast<size_t>(device)];
    if (!s) (void)cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }

  uint64_t reserved_bytes() const {
    uint64_t total = 0;
    for (size_t d = 0; d < kMaxDevices; ++d) {
      if (!configured_[d]) continue;
      cudaMemPool_t pool = nullptr;
      uint64_t reserved = 0;
      if (cudaDeviceGetDefaultMemPool(&pool, static_cast<int>(d)) == cudaSuccess &&
          cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
              cudaSuccess) {
        total += reserved;
      }
    }
    return total;
  }

  [[noreturn]] void fail_out_of_memory(int device, size_t size) const {
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    (void)cudaGetLastError();
    const AllocatorStats s = stats();
    // Whole MiB in fixed notation (a stream would print 4194304 as 4.1943e+06).
    auto mib = [](uint64_t bytes) {
      return std::to_string(static_cast<uint64_t>(static_cast<double>(bytes) / kMiB + 0.5));
    };
    DPAR_FAIL("CUDA out of memory in ", last_kernel(), ": tried to allocate ", mib(size),
              " MiB on cuda:", device, "; dpar holds ", mib(s.allocated_bytes),
              " MiB in tensors and ", mib(s.cached_bytes), " MiB cached; the device has ",
              mib(free_bytes), " MiB free of ", mib(total_bytes), " MiB");
  }

  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  AllocatorStats stats_;
  std::array<std::atomic<bool>, kMaxDevices> configured_{};
  std::array<cudaStream_t, kMaxDevices> release_streams_{};
  std::array<uint64_t, kMaxDevices> last_reserved_{};  // pool size at the last allocation
};

StreamOrderedAllocator& instance() {
  static auto* a = new StreamOrderedAllocator();  // never destroyed: used from exit handlers
  return *a;
}

}  // namespace

Allocator* device_allocator() { return &instance(); }

void record_stream(void* ptr, cudaStream_t stream) { instance().record_stream(ptr, stream); }

}  // namespace dpar::cuda
