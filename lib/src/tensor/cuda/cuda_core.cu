// CUDA copy (any strides, any dtype pair), fill (any dtype, any strides) and the host<->device
// transfer. Conversions follow the CPU backend (tensor/cpu/core_kernels.cpp) value for value.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <type_traits>

#include "tensor/core_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/float_types.cuh"
#include "tensor/cuda/pinned_memory.h"
#include "tensor/cuda/strided_indexer.cuh"

namespace dpar::cuda {
namespace {

// Every dtype: the floating ones through visit_float_dtype, then the integers.
template <class Fn>
void visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::i64:
      return fn(Tag<int64_t>{});
    case DType::u8:
      return fn(Tag<uint8_t>{});
    default:
      return visit_float_dtype(t, "copy", fn);
  }
}

template <class T>
__device__ __forceinline__ double to_double(T v) {
  if constexpr (kFloating<T>) {
    return static_cast<double>(to_float(v));
  } else {
    return static_cast<double>(v);
  }
}

// The CPU stores through a double: integers truncate toward zero (u8 wraps via i64), floats
// round from double to f32 first.
template <class T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (kFloating<T>) return from_float<T>(static_cast<float>(v));
  if constexpr (std::is_same_v<T, int64_t>) return static_cast<int64_t>(v);
  if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<uint8_t>(static_cast<int64_t>(v));
  }
}

template <class S, class D>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else if constexpr (kFloating<S> && kFloating<D>) {
    // Exactly what the CPU's detour through double gives, without double arithmetic.
    return from_float<D>(to_float(v));
  } else {
    return from_double<D>(to_double(v));
  }
}

template <class S, class D>
__global__ void copy_flat_kernel(const S* src, D* dst, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { dst[i] = convert<S, D>(src[i]); }
}

template <class S, class D>
__global__ void copy_strided_kernel(const S* src, D* dst, StridedIndexer<2> ix, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[1]] = convert<S, D>(src[off[0]]);
  }
}

void copy_cuda(const Tensor& src, Tensor& dst) {
  DeviceGuard guard(dst.device());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const bool same_dense_layout = src.strides() == dst.strides() && src.is_dense();
  const cudaStream_t stream = current_stream();
  if (same_dense_layout && src.dtype() == dst.dtype()) {
    check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToDevice,
                          stream),
          "copy: cudaMemcpyAsync");
    return;
  }
  const Shape* strides[2] = {&src.strides(), &dst.strides()};
  const StridedIndexer<2> ix =
      same_dense_layout ? StridedIndexer<2>{} : make_indexer<2>(dst.shape(), strides);
  visit_dtype(src.dtype(), [&](auto s) {
    visit_dtype(dst.dtype(), [&](auto d) {
      using S = typename decltype(s)::type;
      using D = typename decltype(d)::type;
      const S* ps = static_cast<const S*>(src.raw_data());
      D* pd = static_cast<D*>(dst.raw_data());
      if (same_dense_layout) {
        copy_flat_kernel<S, D><<<blocks_for(n), kThreads, 0, stream>>>(ps, pd, n);
      } else {
        copy_strided_kernel<S, D><<<blocks_for(n), kThreads, 0, stream>>>(ps, pd, ix, n);
      }
    });
  });
  check_launch("copy");
}

// Fill writes the value's bit pattern, converted on the host with the CPU's own conversions, so
// every dtype gets exactly the bits the CPU would store.
template <class Bits>
__global__ void fill_flat_kernel(Bits* dst, int64_t n, Bits value) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { dst[i] = value; }
}

template <class Bits>
__global__ void fill_strided_kernel(Bits* dst, StridedIndexer<1> ix, int64_t n, Bits value) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[1];
    ix.offsets(i, off);
    dst[off[0]] = value;
  }
}

template <class Bits>
void launch_fill(Tensor& dst, Bits value) {
  const int64_t n = dst.numel();
  const cudaStream_t stream = current_stream();
  Bits* p = static_cast<Bits*>(dst.raw_data());
  if (dst.is_dense()) {
    if (value == 0) {
      check(cudaMemsetAsync(p, 0, dst.nbytes(), stream), "fill: cudaMemsetAsync");
      return;
    }
    fill_flat_kernel<Bits><<<blocks_for(n), kThreads, 0, stream>>>(p, n, value);
  } else {
    const Shape* strides[1] = {&dst.strides()};
    const StridedIndexer<1> ix = make_indexer<1>(dst.shape(), strides);
    fill_strided_kernel<Bits><<<blocks_for(n), kThreads, 0, stream>>>(p, ix, n, value);
  }
  check_launch("fill");
}

void fill_cuda(Tensor& dst, double value) {
  DeviceGuard guard(dst.device());
  if (dst.numel() == 0) return;
  switch (dst.dtype()) {
    case DType::f32: {
      const float f = static_cast<float>(value);
      uint32_t bits = 0;
      std::memcpy(&bits, &f, sizeof bits);
      return launch_fill<uint32_t>(dst, bits);
    }
    case DType::f16:
      return launch_fill<uint16_t>(dst, float_to_half(static_cast<float>(value)));
    case DType::bf16:
      return launch_fill<uint16_t>(dst, float_to_bf16(static_cast<float>(value)));
    case DType::i64:
      return launch_fill<uint64_t>(dst, static_cast<uint64_t>(static_cast<int64_t>(value)));
    case DType::u8:
      return launch_fill<uint8_t>(dst, static_cast<uint8_t>(static_cast<int64_t>(value)));
  }
  DPAR_FAIL("fill on CUDA: unsupported dtype ", dst.dtype());
}

__global__ void count_up_kernel(int64_t* p, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { ++p[i]; }
}

void count_up_cuda(Tensor& counter) {
  DPAR_CHECK(counter.dtype() == DType::i64 && counter.is_dense(),
             "count_up: expected a dense i64 tensor, got ", counter.dtype());
  DeviceGuard guard(counter.device());
  const int64_t n = counter.numel();
  if (n == 0) return;
  count_up_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      static_cast<int64_t*>(counter.raw_data()), n);
  check_launch("count_up");
}

void copy_across_devices_cuda(const Tensor& src, Tensor& dst) {
  DPAR_CHECK(src.dtype() == dst.dtype() && src.strides() == dst.strides() && src.is_dense() &&
                 dst.is_dense(),
             "copy_across_devices on CUDA needs dense tensors of one dtype and layout; got ",
             src.dtype(), " strides ", src.strides(), " and ", dst.dtype(), " strides ",
             dst.strides());
  if (dst.numel() == 0) return;
  if (src.device().is_cpu()) {
    DeviceGuard guard(dst.device());
    // From pageable memory the call returns once the source is staged, so the host buffer
    // may be released right after; a pinned block is read later, by the DMA engine, so its
    // reuse waits for this copy.
    const cudaStream_t stream = current_stream(dst.device().index);
    check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyHostToDevice,
                          stream),
          "copy_across_devices: host to device");
    if (src.is_pinned()) record_pinned_use(src.storage()->data(), stream);
    return;
  }
  if (dst.device().is_cpu()) {
    DeviceGuard guard(src.device());
    check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToHost,
                          current_stream(src.device().index)),
          "copy_across_devices: device to host");
    synchronize(src.device().index);  // the host reads dst as soon as this returns
    return;
  }
  // Between two GPUs: src's producers run on src's stream and its memory may be reused there
  // once freed, so the copy is bracketed by synchronisations of both sides (a rare path).
  DeviceGuard guard(dst.device());
  synchronize(src.device().index);
  check(cudaMemcpyPeerAsync(dst.raw_data(), dst.device().index, src.raw_data(), src.device().index,
                            src.nbytes(), current_stream(dst.device().index)),
        "copy_across_devices: device to device");
  synchronize(dst.device().index);
}

}  // namespace

void register_core_kernels() {
  kernels::copy.set(DeviceType::CUDA, &copy_cuda);
  kernels::fill.set(DeviceType::CUDA, &fill_cuda);
  kernels::count_up.set(DeviceType::CUDA, &count_up_cuda);
  kernels::copy_across_devices.set(DeviceType::CUDA, &copy_across_devices_cuda);
}

}  // namespace dpar::cuda
