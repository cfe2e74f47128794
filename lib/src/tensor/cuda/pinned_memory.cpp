// Pinned host memory, cached like PyTorch's CachingHostAllocator: cudaHostAlloc and
// cudaFreeHost are slow (they change page tables and synchronise the device), so freed blocks
// are kept by size and handed out again, but only once every copy that read a block has
// completed (an event per use, recorded by record_pinned_use). Asynchronous host-to-device
// copies run on one copy stream per device, so a batch moves while the previous step's kernels
// still run.
#include "tensor/cuda/pinned_memory.h"

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/core_kernels.h"
#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_context.h"

namespace dpar::cuda {
namespace {

class PinnedCache {
 public:
  void* allocate(size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    reclaim();
    // Reuse a free block of at least the size and at most twice it (batches repeat sizes).
    auto it = free_.lower_bound(nbytes);
    if (it != free_.end() && it->first <= 2 * nbytes) {
      void* p = it->second;
      live_[p] = Block{it->first, {}};
      free_.erase(it);
      return p;
    }
    void* p = nullptr;
    cudaError_t status = cudaHostAlloc(&p, nbytes, cudaHostAllocPortable);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      release_free_blocks();  // give the cache back and try once more
      status = cudaHostAlloc(&p, nbytes, cudaHostAllocPortable);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      DPAR_FAIL("pin_memory: cannot pin ", (nbytes + (1 << 20) - 1) >> 20,
                " MiB of host memory: ", cudaGetErrorString(status));
    }
    live_[p] = Block{nbytes, {}};
    return p;
  }

  void release(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    pending_.emplace_back(p, std::move(it->second));
    live_.erase(it);
    reclaim();
  }

  void record_use(void* p, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    cudaEvent_t done = nullptr;
    check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "pin_memory: cudaEventCreate");
    check(cudaEventRecord(done, stream), "pin_memory: cudaEventRecord");
    it->second.uses.push_back(done);
  }

 private:
  struct Block {
    size_t size = 0;
    std::vector<cudaEvent_t> uses;  // copies that read the block
  };

  // Moves released blocks whose copies have all completed to the free list.
  void reclaim() {
    for (size_t i = 0; i < pending_.size();) {
      Block& b = pending_[i].second;
      bool done = true;
      for (cudaEvent_t e : b.uses) done = done && cudaEventQuery(e) != cudaErrorNotReady;
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t e : b.uses) (void)cudaEventDestroy(e);
      free_.emplace(b.size, pending_[i].first);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  void release_free_blocks() {
    for (auto& [size, p] : free_) (void)cudaFreeHost(p);
    free_.clear();
  }

  std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::vector<std::pair<void*, Block>> pending_;  // released, some copy may still read it
  std::multimap<size_t, void*> free_;
};

// Never destroyed: Storages may release blocks during static destruction.
PinnedCache& cache() {
  static auto* instance = new PinnedCache();
  return *instance;
}

// One copy stream per device, created on first use and kept for the process.
cudaStream_t copy_stream(int device) {
  static std::mutex mutex;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "pin_memory: copy stream");
  streams[device] = s;
  return s;
}

}  // namespace

std::shared_ptr<Storage> alloc_pinned(size_t nbytes) {
  void* p = cache().allocate(nbytes == 0 ? 1 : nbytes);
  return std::make_shared<Storage>(
      p, nbytes, Device::cpu(), [](void* q) { cache().release(q); }, /*pinned=*/true);
}

void record_pinned_use(void* block, cudaStream_t stream) { cache().record_use(block, stream); }

Tensor to_device_async(const Tensor& src, Device target) {
  DPAR_CHECK(src.device().is_cpu() && src.is_pinned() && src.is_contiguous(),
             "to_device_async: expected a contiguous pinned CPU tensor, got ", src.str());
  DeviceGuard guard(target);
  const cudaStream_t compute = current_stream(target.index);
  const cudaStream_t copy = copy_stream(target.index);
  Tensor dst;
  {
    // Allocated and filled in the copy stream's order: neither waits for queued kernels.
    StreamGuard on_copy(target.index, copy);
    dst = Tensor::empty(src.shape(), src.dtype(), target);
    if (src.numel() > 0) {
      check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyHostToDevice,
                            copy),
            "to_device_async: host to device");
    }
  }
  if (src.numel() == 0) return dst;
  record_pinned_use(src.storage()->data(), copy);
  cudaEvent_t copied = nullptr;
  check(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(copied, copy), "cudaEventRecord");
  check(cudaStreamWaitEvent(compute, copied, 0), "cudaStreamWaitEvent");
  (void)cudaEventDestroy(copied);  // released once it has completed
  // The compute stream uses dst; its memory returns to the pool only after that use.
  record_stream(dst.storage()->data(), compute);
  return dst;
}

void register_pinned_memory() {
  kernels::alloc_pinned.set(DeviceType::CUDA, &alloc_pinned);
  kernels::to_device_async.set(DeviceType::CUDA, &to_device_async);
}

}  // namespace dpar::cuda
