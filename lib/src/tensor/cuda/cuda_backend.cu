// CUDA backend seam: a caching device allocator, host<->device transfer, and the first
// elementwise kernels. Compiled in every CUDA-enabled build (CI builds it without a GPU);
// the full GPU op set (cuDNN convolutions, NCCL) builds on these slots.
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "dpar/tensor/allocator.h"
#include "tensor/core_kernels.h"
#include "tensor/elementwise_kernels.h"

namespace dpar::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  DPAR_CHECK(status == cudaSuccess, "CUDA error in ", what, ": ", cudaGetErrorString(status));
}

// Caches freed device blocks by exact size per device, like the CPU allocator: cudaMalloc
// and cudaFree synchronise the device and must stay out of the training loop.
class CudaCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t size = (nbytes + 511) / 512 * 512;
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    std::lock_guard<std::mutex> lock(mutex_);
    auto& blocks = free_[{device, size}];
    stats_.allocated_bytes += size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    if (!blocks.empty()) {
      void* p = blocks.back();
      blocks.pop_back();
      stats_.cached_bytes -= size;
      return p;
    }
    void* p = nullptr;
    check(cudaMalloc(&p, size == 0 ? 512 : size), "cudaMalloc");
    ++stats_.system_allocations;
    owner_[p] = device;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    const size_t size = (nbytes + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated_bytes -= size;
    stats_.cached_bytes += size;
    free_[{owner_[ptr], size}].push_back(ptr);
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, blocks] : free_) {
      for (void* p : blocks) {
        cudaFree(p);
        owner_.erase(p);
      }
    }
    free_.clear();
    stats_.cached_bytes = 0;
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  struct Key {
    int device;
    size_t size;
    bool operator==(const Key& o) const { return device == o.device && size == o.size; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<size_t>()(k.size) ^ (static_cast<size_t>(k.device) << 56);
    }
  };
  mutable std::mutex mutex_;
  std::unordered_map<Key, std::vector<void*>, KeyHash> free_;
  std::unordered_map<void*, int> owner_;
  AllocatorStats stats_;
};

void require_dense_same_layout(const Tensor& a, const Tensor& b, const char* op) {
  DPAR_CHECK(a.is_dense() && b.is_dense() && a.strides() == b.strides(), op,
             " on CUDA supports dense tensors of one layout; got strides ", a.strides(), " and ",
             b.strides());
}

__global__ void fill_f32(float* p, int64_t n, float v) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = v;
}

__global__ void affine_f32(const float* a, float* out, int64_t n, float alpha, float beta) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] * alpha + beta;
}

__global__ void axpy_f32(float* self, const float* other, int64_t n, float alpha) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) self[i] += alpha * other[i];
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

void fill_cuda(Tensor& dst, double value) {
  DPAR_CHECK(dst.dtype() == DType::f32 || value == 0.0, "fill on CUDA supports f32 (or zero), got ",
             dst.dtype());
  DPAR_CHECK(dst.is_dense(), "fill on CUDA needs a dense tensor, got strides ", dst.strides());
  if (dst.numel() == 0) return;
  if (value == 0.0) {
    check(cudaMemset(dst.raw_data(), 0, dst.nbytes()), "cudaMemset");
    return;
  }
  fill_f32<<<blocks_for(dst.numel()), 256>>>(static_cast<float*>(dst.raw_data()), dst.numel(),
                                             static_cast<float>(value));
  check(cudaGetLastError(), "fill kernel");
}

void copy_cuda(const Tensor& src, Tensor& dst) {
  DPAR_CHECK(src.dtype() == dst.dtype(), "copy on CUDA between dtypes ", src.dtype(), " and ",
             dst.dtype(), " is done on the CPU side");
  require_dense_same_layout(src, dst, "copy");
  check(cudaMemcpy(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToDevice),
        "cudaMemcpy D2D");
}

void copy_across_devices_cuda(const Tensor& src, Tensor& dst) {
  require_dense_same_layout(src, dst, "host<->device copy");
  const cudaMemcpyKind kind =
      src.device().is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  check(cudaMemcpy(dst.raw_data(), src.raw_data(), src.nbytes(), kind), "cudaMemcpy host<->device");
}

void affine_cuda(const Tensor& a, double alpha, double beta, Tensor& out) {
  require_dense_same_layout(a, out, "affine");
  if (out.numel() == 0) return;
  affine_f32<<<blocks_for(out.numel()), 256>>>(static_cast<const float*>(a.raw_data()),
                                               static_cast<float*>(out.raw_data()), out.numel(),
                                               static_cast<float>(alpha), static_cast<float>(beta));
  check(cudaGetLastError(), "affine kernel");
}

void add_inplace_cuda(Tensor& self, const Tensor& other, double alpha) {
  require_dense_same_layout(self, other, "add_");
  if (self.numel() == 0) return;
  axpy_f32<<<blocks_for(self.numel()), 256>>>(static_cast<float*>(self.raw_data()),
                                              static_cast<const float*>(other.raw_data()),
                                              self.numel(), static_cast<float>(alpha));
  check(cudaGetLastError(), "add_ kernel");
}

}  // namespace
}  // namespace dpar::cuda

namespace dpar::detail {

void register_cuda_backend() {
  static auto* allocator = new cuda::CudaCachingAllocator();
  register_allocator(DeviceType::CUDA, allocator);
  kernels::fill.set(DeviceType::CUDA, &cuda::fill_cuda);
  kernels::copy.set(DeviceType::CUDA, &cuda::copy_cuda);
  kernels::copy_across_devices.set(DeviceType::CUDA, &cuda::copy_across_devices_cuda);
  kernels::affine.set(DeviceType::CUDA, &cuda::affine_cuda);
  kernels::add_inplace.set(DeviceType::CUDA, &cuda::add_inplace_cuda);
}

}  // namespace dpar::detail
