#pragma once
// The floating storage types of the CPU kernels that amp::Autocast's bf16 activations pass
// through (f32 and bf16): a kernel computes in f32 and converts on load and store, so a bf16
// tensor runs through the f32 formulas with one rounding at the store (as the CUDA kernels do,
// tensor/cuda/float_types.cuh). For f32 the conversions are the identity, so f32 results are
// the same bits as before the kernels were templated.
#include <cstdint>
#include <type_traits>

#include "dpar/core/dtype.h"
#include "dpar/core/error.h"
#include "dpar/tensor/tensor.h"

namespace dpar::cpu {

// A bf16 element: the top half of an f32.
struct BF16 {
  uint16_t bits;
};

template <class T>
struct Tag {
  using type = T;
};

[[gnu::always_inline]] inline float to_float(float v) { return v; }
[[gnu::always_inline]] inline float to_float(BF16 v) { return bf16_to_float(v.bits); }

template <class T>
[[gnu::always_inline]] inline T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return BF16{float_to_bf16(v)};
  }
}

// v rounded to T and widened again: the value a T store of v holds, kept in f32 so that loops
// reuse it without a T local (see normalize in bn_loops.h). from_float<T> of it is exact.
template <class T>
[[gnu::always_inline]] inline float rounded(float v) {
  return to_float(from_float<T>(v));
}

// Calls fn(Tag<T>{}) with T the storage type of an f32 or bf16 tensor; other dtypes fail
// naming op.
template <class Fn>
void visit_float_dtype(DType t, const char* op, Fn&& fn) {
  if (t == DType::f32) return fn(Tag<float>{});
  if (t == DType::bf16) return fn(Tag<BF16>{});
  DPAR_FAIL(op, " on the CPU supports f32 and bf16, got ", t);
}

// The operands of one kernel share the first one's floating dtype.
inline void require_same_float(const char* op, const Tensor& first, const Tensor& other,
                               const char* which) {
  DPAR_CHECK(other.dtype() == first.dtype(), op, " on the CPU: ", which, " has dtype ",
             other.dtype(), ", the other operands ", first.dtype());
}

// A tensor's elements as the kernel's storage type T.
template <class T>
T* data_as(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

}  // namespace dpar::cpu
