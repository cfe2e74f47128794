#pragma once
// The floating storage types of CUDA kernels (f32, f16, bf16): every kernel computes in f32 and
// converts on load and store, so f16/bf16 tensors (activations under amp::Autocast) run through
// the f32 formulas with one rounding at the store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "dpar/core/error.h"
#include "dpar/tensor/tensor.h"

namespace dpar::cuda {

template <class T>
struct Tag {
  using type = T;
};

template <class T>
inline constexpr bool kFloating =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
}

// Calls fn(Tag<T>{}) with T the storage type of a floating dtype; other dtypes fail naming op.
template <class Fn>
void visit_float_dtype(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32:
      return fn(Tag<float>{});
    case DType::f16:
      return fn(Tag<__half>{});
    case DType::bf16:
      return fn(Tag<__nv_bfloat16>{});
    default:
      break;
  }
  DPAR_FAIL(op, " on CUDA supports f32, f16 and bf16, got ", t);
}

// The operands of one kernel share the first one's floating dtype.
inline void require_same_float(const char* op, const Tensor& first, const Tensor& other,
                               const char* which) {
  DPAR_CHECK(other.dtype() == first.dtype(), op, " on CUDA: ", which, " has dtype ", other.dtype(),
             ", the other operands ", first.dtype());
}

// A tensor's elements as the kernel's storage type T.
template <class T>
T* data_as(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

}  // namespace dpar::cuda
