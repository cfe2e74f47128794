// Multi-tensor CUDA kernels for the optimizer updates (PyTorch's multi_tensor_apply): one
// launch updates every parameter of a step instead of one launch per parameter, which is what
// bounds a MobileNetV3 step (~150 small parameters) on a GPU. The per-element math is
// optim_math.cuh's, shared with the single-tensor kernels, so results are bitwise equal.
//
// The addresses, sizes and per-tensor scalars of up to TensorList::kMax tensors travel in the
// kernel's parameters (no host-to-device copy, nothing to keep alive after the launch). Every
// tensor is cut into chunks of kChunk elements and each CUDA block updates one chunk, so a
// 1M-element weight spreads over many SMs while a 16-element BatchNorm bias costs one block.
// A block finds its tensor by binary search over the tensors' first chunk indices. A step
// with more tensors than one list holds takes several launches.
#include <cuda_runtime.h>

#include <array>
#include <climits>
#include <cstdint>
#include <vector>

#include "optim/optim_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/optim_checks.h"
#include "tensor/cuda/optim_math.cuh"

namespace dpar::cuda {
namespace {

// Elements per block: 16 per thread, small enough that the 2-5M parameters of a MobileNetV3
// give several blocks per SM (the update is memory-bound and needs warps in flight).
constexpr int64_t kChunk = 16 * kThreads;

// Kernel parameter bytes one launch may use. CUDA 12.1 raised the limit from 4 KiB to 32764
// bytes on every architecture CUDA 12+ builds for (Volta and newer); 12 KiB holds ~230
// tensors of the deepest list, so MobileNetV3-large's step is one launch, while a launch
// still copies little more than a few KiB of parameters.
#if CUDART_VERSION >= 12010
constexpr size_t kParamBytes = 12 * 1024;
#else
constexpr size_t kParamBytes = 4000;
#endif
// Room left in kParamBytes for the scalar argument struct and the count.
constexpr size_t kScalarRoom = 128;

// The tensors of one launch. ptr[k][t] is operand k (param, grad, state...) of tensor t, or
// nullptr for an unused state buffer; extra[t] holds the per-tensor scalars.
template <int Depth, class Extra>
struct TensorList {
  static constexpr int kMax =
      static_cast<int>((kParamBytes - kScalarRoom) / (Depth * sizeof(float*) + sizeof(int64_t) +
                                                      sizeof(int32_t) + sizeof(Extra)));
  float* ptr[Depth][kMax];
  int64_t numel[kMax];
  int32_t first_chunk[kMax];  // the first block of each tensor, ascending
  Extra extra[kMax];
  int count;
};

struct NoExtra {};
struct SgdExtra {
  bool first_step;
};
struct AdamwExtra {
  float step_size;
  float bias_correction2_sqrt;
};

using SgdList = TensorList<3, SgdExtra>;
using RmspropList = TensorList<5, NoExtra>;
using AdamwList = TensorList<4, AdamwExtra>;
static_assert(sizeof(SgdList) + sizeof(kernels::SgdStepArgs) <= kParamBytes);
static_assert(sizeof(RmspropList) + sizeof(kernels::RmspropStepArgs) <= kParamBytes);
static_assert(sizeof(AdamwList) + sizeof(kernels::AdamwStepArgs) <= kParamBytes);

// The tensor this block updates and the element range [begin, end) of its chunk.
struct Chunk {
  int tensor;
  int64_t begin;
  int64_t end;
};

template <int Depth, class Extra>
__device__ __forceinline__ Chunk chunk_of_block(const TensorList<Depth, Extra>& l) {
  const int block = static_cast<int>(blockIdx.x);
  int lo = 0, hi = l.count - 1;  // the last tensor whose first chunk is <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (l.first_chunk[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  Chunk c;
  c.tensor = lo;
  c.begin = static_cast<int64_t>(block - l.first_chunk[lo]) * kChunk;
  c.end = c.begin + kChunk < l.numel[lo] ? c.begin + kChunk : l.numel[lo];
  return c;
}

__global__ void sgd_multi_kernel(SgdList l, kernels::SgdStepArgs args) {
  const Chunk c = chunk_of_block(l);
  kernels::SgdStepArgs a = args;
  a.first_step = l.extra[c.tensor].first_step;
  float* p = l.ptr[0][c.tensor];
  const float* g = l.ptr[1][c.tensor];
  float* b = l.ptr[2][c.tensor];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    p[i] = sgd_update(p[i], g[i], b ? b + i : nullptr, a);
  }
}

__global__ void rmsprop_multi_kernel(RmspropList l, kernels::RmspropStepArgs a) {
  const Chunk c = chunk_of_block(l);
  float* p = l.ptr[0][c.tensor];
  const float* g = l.ptr[1][c.tensor];
  float* sq = l.ptr[2][c.tensor];
  float* ga = l.ptr[3][c.tensor];
  float* b = l.ptr[4][c.tensor];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    p[i] = rmsprop_update(p[i], g[i], sq[i], ga ? ga + i : nullptr, b ? b + i : nullptr, a);
  }
}

__global__ void adamw_multi_kernel(AdamwList l, kernels::AdamwStepArgs args) {
  const Chunk c = chunk_of_block(l);
  kernels::AdamwStepArgs a = args;
  a.step_size = l.extra[c.tensor].step_size;
  a.bias_correction2_sqrt = l.extra[c.tensor].bias_correction2_sqrt;
  float* p = l.ptr[0][c.tensor];
  const float* g = l.ptr[1][c.tensor];
  float* m = l.ptr[2][c.tensor];
  float* v = l.ptr[3][c.tensor];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    p[i] = adamw_update(p[i], g[i], m[i], v[i], a);
  }
}

// Fills tensor lists and launches `kernel` on the current stream of `device` whenever one is
// full, and for the rest at flush().
template <class List, class Args>
class ListLauncher {
 public:
  using Kernel = void (*)(List, Args);
  ListLauncher(Device device, const char* name, Kernel kernel, const Args& args)
      : stream_(current_stream(device.index)), name_(name), kernel_(kernel), args_(args) {}

  template <size_t Depth, class Extra>
  void add(const std::array<float*, Depth>& ptrs, int64_t numel, const Extra& extra) {
    if (numel == 0) return;
    const int64_t chunks = (numel + kChunk - 1) / kChunk;
    DPAR_CHECK(chunks <= INT_MAX, name_, " on CUDA: a tensor of ", numel, " elements is too large");
    if (list_.count == List::kMax || chunks_ + chunks > INT_MAX) flush();
    const int t = list_.count++;
    for (size_t k = 0; k < Depth; ++k) list_.ptr[k][t] = ptrs[k];
    list_.numel[t] = numel;
    list_.first_chunk[t] = static_cast<int32_t>(chunks_);
    list_.extra[t] = extra;
    chunks_ += chunks;
  }

  void flush() {
    if (list_.count == 0) return;
    kernel_<<<static_cast<unsigned>(chunks_), kThreads, 0, stream_>>>(list_, args_);
    check_launch(name_);
    list_.count = 0;
    chunks_ = 0;
  }

 private:
  cudaStream_t stream_;
  const char* name_;
  Kernel kernel_;
  Args args_;
  List list_{};
  int64_t chunks_ = 0;
};

// Checks one item's operands like the single-tensor slot does, plus one device for all items.
// Every item is checked before the first launch, so a bad one leaves all parameters as they
// were.
void check_item(const Tensor& param, Device device, const char* op) {
  check_param(param, op);
  DPAR_CHECK(param.device() == device, op, " on CUDA: every parameter must be on ", device.str(),
             ", got one on ", param.device().str());
}

float* f32_or_null(const Tensor& t) { return t.defined() ? f32(t) : nullptr; }

void sgd_step_multi_cuda(std::vector<kernels::SgdStepItem>& items,
                         const kernels::SgdStepArgs& args) {
  if (items.empty()) return;
  const Device device = items.front().param.device();
  DeviceGuard guard(device);
  ListLauncher<SgdList, kernels::SgdStepArgs> launch(device, "sgd_step_multi", &sgd_multi_kernel,
                                                     args);
  for (const kernels::SgdStepItem& it : items) {
    check_item(it.param, device, "sgd_step_multi");
    check_operand(it.grad, it.param, "sgd_step_multi", "grad");
    if (it.momentum_buffer.defined()) {
      check_operand(it.momentum_buffer, it.param, "sgd_step_multi", "momentum_buffer");
    }
  }
  for (const kernels::SgdStepItem& it : items) {
    launch.add(std::array<float*, 3>{f32(it.param), f32(it.grad), f32_or_null(it.momentum_buffer)},
               it.param.numel(), SgdExtra{it.first_step});
  }
  launch.flush();
}

void rmsprop_step_multi_cuda(std::vector<kernels::RmspropStepItem>& items,
                             const kernels::RmspropStepArgs& args) {
  if (items.empty()) return;
  const Device device = items.front().param.device();
  DeviceGuard guard(device);
  ListLauncher<RmspropList, kernels::RmspropStepArgs> launch(device, "rmsprop_step_multi",
                                                             &rmsprop_multi_kernel, args);
  for (const kernels::RmspropStepItem& it : items) {
    check_item(it.param, device, "rmsprop_step_multi");
    check_operand(it.grad, it.param, "rmsprop_step_multi", "grad");
    check_operand(it.square_avg, it.param, "rmsprop_step_multi", "square_avg");
    if (it.grad_avg.defined()) {
      check_operand(it.grad_avg, it.param, "rmsprop_step_multi", "grad_avg");
    }
    if (it.momentum_buffer.defined()) {
      check_operand(it.momentum_buffer, it.param, "rmsprop_step_multi", "momentum_buffer");
    }
  }
  for (const kernels::RmspropStepItem& it : items) {
    launch.add(std::array<float*, 5>{f32(it.param), f32(it.grad), f32(it.square_avg),
                                     f32_or_null(it.grad_avg), f32_or_null(it.momentum_buffer)},
               it.param.numel(), NoExtra{});
  }
  launch.flush();
}

void adamw_step_multi_cuda(std::vector<kernels::AdamwStepItem>& items,
                           const kernels::AdamwStepArgs& args) {
  if (items.empty()) return;
  const Device device = items.front().param.device();
  DeviceGuard guard(device);
  ListLauncher<AdamwList, kernels::AdamwStepArgs> launch(device, "adamw_step_multi",
                                                         &adamw_multi_kernel, args);
  for (const kernels::AdamwStepItem& it : items) {
    check_item(it.param, device, "adamw_step_multi");
    check_operand(it.grad, it.param, "adamw_step_multi", "grad");
    check_operand(it.exp_avg, it.param, "adamw_step_multi", "exp_avg");
    check_operand(it.exp_avg_sq, it.param, "adamw_step_multi", "exp_avg_sq");
  }
  for (const kernels::AdamwStepItem& it : items) {
    launch.add(
        std::array<float*, 4>{f32(it.param), f32(it.grad), f32(it.exp_avg), f32(it.exp_avg_sq)},
        it.param.numel(), AdamwExtra{it.step_size, it.bias_correction2_sqrt});
  }
  launch.flush();
}

}  // namespace

void register_optim_multi_kernels() {
  kernels::sgd_step_multi.set(DeviceType::CUDA, &sgd_step_multi_cuda);
  kernels::rmsprop_step_multi.set(DeviceType::CUDA, &rmsprop_step_multi_cuda);
  kernels::adamw_step_multi.set(DeviceType::CUDA, &adamw_step_multi_cuda);
}

}  // namespace dpar::cuda
