// CUDA kernels for binary arithmetic, scalar affine maps, in-place add and sum-reductions, on
// f32 like the CPU backend and on f16/bf16 (computed in f32, rounded once at the store: the
// activations amp::Autocast keeps in half precision). Products and sums that the CPU computes as
// separate roundings use
// __fmul_rn/__fadd_rn so that nvcc does not contract them into an FMA: results are bit-equal.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/float_types.cuh"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/elementwise_kernels.h"

namespace dpar::cuda {
namespace {

using kernels::BinaryOp;

template <BinaryOp Op>
__device__ __forceinline__ float apply(float x, float y) {
  if constexpr (Op == BinaryOp::add) {
    return x + y;
  } else if constexpr (Op == BinaryOp::sub) {
    return x - y;
  } else if constexpr (Op == BinaryOp::mul) {
    return x * y;
  } else {
    return x / y;
  }
}

template <BinaryOp Op, class T>
__global__ void binary_flat_kernel(const T* a, const T* b, T* out, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { out[i] = from_float<T>(apply<Op>(to_float(a[i]), to_float(b[i]))); }
}

template <BinaryOp Op, class T>
__global__ void binary_strided_kernel(const T* a, const T* b, T* out, StridedIndexer<3> ix,
                                      int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = from_float<T>(apply<Op>(to_float(a[off[1]]), to_float(b[off[2]])));
  }
}

// A dense 4-D output (NCHW or channels-last) where one operand has the output's strides and the
// other holds one value per (sample, channel), expanded over H and W: the gates of
// squeeze-and-excitation and their gradients. The general indexer divides four 64-bit indices
// per operand and element; this needs one 32-bit division or two.
struct ChannelBroadcast {
  uint32_t C, HW;
  bool nhwc;
  int64_t stride_n, stride_c;  // of the per-channel operand (0 where it is broadcast too)
};

template <BinaryOp Op, bool GateSecond, class T>
__global__ void binary_channel_broadcast_kernel(const T* full, const T* gate, T* out,
                                                ChannelBroadcast cb, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    uint32_t sample, channel;
    if (cb.nhwc) {
      sample = i / (cb.HW * cb.C);
      channel = i % cb.C;
    } else {
      const uint32_t plane = i / cb.HW;
      sample = plane / cb.C;
      channel = plane - sample * cb.C;
    }
    const float g = to_float(gate[sample * cb.stride_n + channel * cb.stride_c]);
    const float f = to_float(full[i]);
    out[i] = from_float<T>(GateSecond ? apply<Op>(f, g) : apply<Op>(g, f));
  }
}

// Whether `full` and `gate` (both already expanded to out's shape) fit the kernel above.
bool channel_broadcast(const Tensor& full, const Tensor& gate, const Tensor& out,
                       ChannelBroadcast& cb) {
  if (out.dim() != 4 || !out.is_dense() || full.strides() != out.strides() ||
      out.numel() >= (int64_t{1} << 31) || gate.stride(2) != 0 || gate.stride(3) != 0)
    return false;
  const bool nhwc = out.is_contiguous(MemoryFormat::ChannelsLast);
  if (!nhwc && !out.is_contiguous()) return false;
  cb = {static_cast<uint32_t>(out.size(1)), static_cast<uint32_t>(out.size(2) * out.size(3)), nhwc,
        gate.stride(0), gate.stride(1)};
  return true;
}

template <BinaryOp Op, class T>
void binary_typed(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  const T* pa = data_as<T>(a);
  const T* pb = data_as<T>(b);
  T* po = data_as<T>(out);
  ChannelBroadcast cb{};
  if (a.strides() == out.strides() && b.strides() == out.strides() && out.is_dense()) {
    binary_flat_kernel<Op><<<blocks_for(n), kThreads, 0, current_stream()>>>(pa, pb, po, n);
  } else if (channel_broadcast(a, b, out, cb)) {
    binary_channel_broadcast_kernel<Op, true><<<blocks_for(n), kThreads, 0, current_stream()>>>(
        pa, pb, po, cb, static_cast<uint32_t>(n));
  } else if (channel_broadcast(b, a, out, cb)) {
    binary_channel_broadcast_kernel<Op, false><<<blocks_for(n), kThreads, 0, current_stream()>>>(
        pb, pa, po, cb, static_cast<uint32_t>(n));
  } else {
    const Shape* strides[3] = {&out.strides(), &a.strides(), &b.strides()};
    const StridedIndexer<3> ix = make_indexer<3>(out.shape(), strides);
    binary_strided_kernel<Op><<<blocks_for(n), kThreads, 0, current_stream()>>>(pa, pb, po, ix, n);
  }
  check_launch("binary");
}

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  DeviceGuard guard(out.device());
  require_same_float("binary", out, a, "a");
  require_same_float("binary", out, b, "b");
  if (out.numel() == 0) return;
  visit_float_dtype(out.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case BinaryOp::add:
        return binary_typed<BinaryOp::add, T>(a, b, out);
      case BinaryOp::sub:
        return binary_typed<BinaryOp::sub, T>(a, b, out);
      case BinaryOp::mul:
        return binary_typed<BinaryOp::mul, T>(a, b, out);
      case BinaryOp::div:
        return binary_typed<BinaryOp::div, T>(a, b, out);
    }
  });
}

template <class T>
__global__ void affine_flat_kernel(const T* a, T* out, int64_t n, float alpha, float beta) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    out[i] = from_float<T>(__fadd_rn(__fmul_rn(to_float(a[i]), alpha), beta));
  }
}

template <class T>
__global__ void affine_strided_kernel(const T* a, T* out, StridedIndexer<2> ix, int64_t n,
                                      float alpha, float beta) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = from_float<T>(__fadd_rn(__fmul_rn(to_float(a[off[1]]), alpha), beta));
  }
}

void affine_cuda(const Tensor& a, double alpha, double beta, Tensor& out) {
  DeviceGuard guard(out.device());
  require_same_float("affine", out, a, "a");
  const int64_t n = out.numel();
  if (n == 0) return;
  const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
  visit_float_dtype(out.dtype(), "affine", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = data_as<T>(a);
    T* po = data_as<T>(out);
    if (a.strides() == out.strides() && out.is_dense()) {
      affine_flat_kernel<T><<<blocks_for(n), kThreads, 0, current_stream()>>>(pa, po, n, al, be);
    } else {
      const Shape* strides[2] = {&out.strides(), &a.strides()};
      const StridedIndexer<2> ix = make_indexer<2>(out.shape(), strides);
      affine_strided_kernel<T>
          <<<blocks_for(n), kThreads, 0, current_stream()>>>(pa, po, ix, n, al, be);
    }
  });
  check_launch("affine");
}

template <class T>
__global__ void add_inplace_flat_kernel(T* self, const T* other, int64_t n, float alpha) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    self[i] = from_float<T>(__fadd_rn(to_float(self[i]), __fmul_rn(alpha, to_float(other[i]))));
  }
}

template <class T>
__global__ void add_inplace_strided_kernel(T* self, const T* other, StridedIndexer<2> ix, int64_t n,
                                           float alpha) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    self[off[0]] =
        from_float<T>(__fadd_rn(to_float(self[off[0]]), __fmul_rn(alpha, to_float(other[off[1]]))));
  }
}

void add_inplace_cuda(Tensor& self, const Tensor& other, double alpha) {
  DeviceGuard guard(self.device());
  require_same_float("add_inplace", self, other, "other");
  const int64_t n = self.numel();
  if (n == 0) return;
  const float al = static_cast<float>(alpha);
  visit_float_dtype(self.dtype(), "add_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* ps = data_as<T>(self);
    const T* po = data_as<T>(other);
    if (self.strides() == other.strides() && self.is_dense()) {
      add_inplace_flat_kernel<T><<<blocks_for(n), kThreads, 0, current_stream()>>>(ps, po, n, al);
    } else {
      const Shape* strides[2] = {&self.strides(), &other.strides()};
      const StridedIndexer<2> ix = make_indexer<2>(self.shape(), strides);
      add_inplace_strided_kernel<T>
          <<<blocks_for(n), kThreads, 0, current_stream()>>>(ps, po, ix, n, al);
    }
  });
  check_launch("add_inplace");
}

// sum_to accumulates in double like the CPU, so sums that nearly cancel still agree with it.
// `outer` maps an output index to (x offset of its first element, out offset); `inner` maps a
// reduced index to an x offset relative to that first element.
template <class TI, class TO>
__global__ void sum_to_thread_kernel(const TI* x, TO* out, StridedIndexer<2> outer,
                                     StridedIndexer<1> inner, int64_t num_out, int64_t num_red) {
  DPAR_CUDA_KERNEL_LOOP(o, num_out) {
    int64_t base[2];
    outer.offsets(o, base);
    double s = 0.0;
    for (int64_t j = 0; j < num_red; ++j) {
      int64_t off[1];
      inner.offsets(j, off);
      s += to_float(x[base[0] + off[0]]);
    }
    out[base[1]] = from_float<TO>(static_cast<float>(s));
  }
}

// One block per output; requires blockDim.x == kThreads (a power of two). The output loop
// depends on blockIdx only, so every thread of a block reaches the same __syncthreads.
template <class TI, class TO>
__global__ void sum_to_block_kernel(const TI* x, TO* out, StridedIndexer<2> outer,
                                    StridedIndexer<1> inner, int64_t num_out, int64_t num_red) {
  __shared__ double partial[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  for (int64_t o = blockIdx.x; o < num_out; o += gridDim.x) {
    int64_t base[2];
    outer.offsets(o, base);
    double s = 0.0;
    for (int64_t j = t; j < num_red; j += kThreads) {
      int64_t off[1];
      inner.offsets(j, off);
      s += to_float(x[base[0] + off[0]]);
    }
    partial[t] = s;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (t < half) partial[t] += partial[t + half];
      __syncthreads();
    }
    if (t == 0) out[base[1]] = from_float<TO>(static_cast<float>(partial[0]));
    __syncthreads();  // partial is rewritten for the next output
  }
}

// Block (tile of 32 outputs, threads y: one of kSumLanes lanes): lane y adds reduced elements
// y, y + kSumLanes, ... of its output in order, then the lanes are added in order, a fixed
// order for a given shape. Consecutive outputs sit next to each other in x where the reduction
// is over the outer dims of a channels-last tensor (the squeeze-and-excitation gate's gradient,
// [N,C,H,W] -> [N,C,1,1]), so a warp's loads are coalesced. inner_stride >= 0 when the reduced
// dims collapse to one stride (no index division per element), else -1 (inner indexer).
// (A thread per output walking every reduced element kept only a few warps per SM busy on
// these shapes: 80 us for an SE gate's gradient on an H100.)
constexpr int kSumLanes = kThreads / 32;

template <class TI, class TO>
__global__ void sum_to_tiled_kernel(const TI* x, TO* out, StridedIndexer<2> outer,
                                    StridedIndexer<1> inner, int64_t inner_stride, int64_t num_out,
                                    int64_t num_red) {
  __shared__ double lane_sums[kSumLanes][32];
  const int64_t o = blockIdx.x * static_cast<int64_t>(32) + threadIdx.x;
  int64_t base[2] = {0, 0};
  double s = 0.0;
  if (o < num_out) {
    outer.offsets(o, base);
    const TI* xo = x + base[0];
    if (inner_stride >= 0) {
      for (int64_t j = threadIdx.y; j < num_red; j += kSumLanes)
        s += to_float(xo[j * inner_stride]);
    } else {
      for (int64_t j = threadIdx.y; j < num_red; j += kSumLanes) {
        int64_t off[1];
        inner.offsets(j, off);
        s += to_float(xo[off[0]]);
      }
    }
  }
  lane_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && o < num_out) {
    for (int l = 1; l < kSumLanes; ++l) s += lane_sums[l][threadIdx.x];
    out[base[1]] = from_float<TO>(static_cast<float>(s));
  }
}

// Merges neighbouring dims that are contiguous with each other (and drops size-1 dims), so the
// per-element index arithmetic of the inner loop does fewer divisions.
std::pair<Shape, Shape> coalesce(const Shape& shape, const Shape& strides) {
  Shape sizes, merged;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!sizes.empty() && merged.back() == strides[d] * shape[d]) {
      sizes.back() *= shape[d];
      merged.back() = strides[d];
    } else {
      sizes.push_back(shape[d]);
      merged.push_back(strides[d]);
    }
  }
  return {sizes, merged};
}

// Below this many outputs a thread per output leaves most of the GPU idle, so each output gets
// a block instead (the bias-gradient case: few channels, many reduced elements).
constexpr int64_t kBlockReduceMaxOutputs = 8192;
// Otherwise outputs with at least this many reduced elements each get kSumLanes threads.
constexpr int64_t kTiledReduceMinReduced = 2 * kSumLanes;

// x and out may differ in dtype (f16/bf16 gradients summed into an f32 bias gradient).
void sum_to_cuda(const Tensor& x, Tensor& out) {
  DeviceGuard guard(out.device());
  DPAR_CHECK(x.dim() == out.dim(), "sum_to on CUDA: out ", out.shape(), " must have the rank of x ",
             x.shape());
  Shape red_shape(x.shape().size(), 1);
  for (size_t d = 0; d < red_shape.size(); ++d) {
    DPAR_CHECK(out.shape()[d] == x.shape()[d] || out.shape()[d] == 1, "sum_to on CUDA: out ",
               out.shape(), " is not a keepdim reduction of x ", x.shape());
    if (out.shape()[d] == 1) red_shape[d] = x.shape()[d];
  }
  const int64_t num_out = out.numel();
  if (num_out == 0) return;
  const int64_t num_red = shape_numel(red_shape);  // 0 when x is empty: out becomes 0
  const Shape* outer_strides[2] = {&x.strides(), &out.strides()};
  const StridedIndexer<2> outer = make_indexer<2>(out.shape(), outer_strides);
  // (Named references, not a structured binding: the kernels' lambdas below capture them.)
  const std::pair<Shape, Shape> inner_dims = coalesce(red_shape, x.strides());
  const Shape& inner_shape = inner_dims.first;
  const Shape& inner_stride = inner_dims.second;
  const Shape* inner_strides[1] = {&inner_stride};
  const StridedIndexer<1> inner = make_indexer<1>(inner_shape, inner_strides);
  visit_float_dtype(x.dtype(), "sum_to", [&](auto in_tag) {
    visit_float_dtype(out.dtype(), "sum_to", [&](auto out_tag) {
      using TI = typename decltype(in_tag)::type;
      using TO = typename decltype(out_tag)::type;
      const TI* px = data_as<TI>(x);
      TO* po = data_as<TO>(out);
      if (num_out <= kBlockReduceMaxOutputs && num_red >= kThreads) {
        const unsigned grid = static_cast<unsigned>(std::min<int64_t>(num_out, 65535));
        sum_to_block_kernel<<<grid, kThreads, 0, current_stream()>>>(px, po, outer, inner, num_out,
                                                                     num_red);
      } else if (num_red >= kTiledReduceMinReduced && (num_out + 31) / 32 <= INT32_MAX) {
        const int64_t inner_flat_stride = inner_shape.size() == 1 ? inner_stride[0] : -1;
        sum_to_tiled_kernel<<<static_cast<unsigned>((num_out + 31) / 32), dim3(32, kSumLanes), 0,
                              current_stream()>>>(px, po, outer, inner, inner_flat_stride, num_out,
                                                  num_red);
      } else {
        sum_to_thread_kernel<<<blocks_for(num_out), kThreads, 0, current_stream()>>>(
            px, po, outer, inner, num_out, num_red);
      }
    });
  });
  check_launch("sum_to");
}

}  // namespace

void register_elementwise_kernels() {
  kernels::binary.set(DeviceType::CUDA, &binary_cuda);
  kernels::affine.set(DeviceType::CUDA, &affine_cuda);
  kernels::add_inplace.set(DeviceType::CUDA, &add_inplace_cuda);
  kernels::sum_to.set(DeviceType::CUDA, &sum_to_cuda);
}

}  // namespace dpar::cuda
