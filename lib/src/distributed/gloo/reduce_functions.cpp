#include "distributed/gloo/reduce_functions.h"

#include <cstdint>
#include <type_traits>

#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return v != v;
  } else {
    return false;
  }
}

struct Sum {
  template <class T>
  static T apply(T a, T b) {
    return a + b;
  }
};
struct Max {
  // NaN wins, so a NaN on any rank is visible on every rank.
  template <class T>
  static T apply(T a, T b) {
    return (a > b || is_nan(a)) ? a : b;
  }
};
struct Min {
  template <class T>
  static T apply(T a, T b) {
    return (a < b || is_nan(a)) ? a : b;
  }
};

// Plain loops over native types; written so the compiler vectorises them (out may alias a,
// which it checks at run time).
template <class T, class Op>
void reduce_native(void* out_, const void* a_, const void* b_, size_t n) {
  T* out = static_cast<T*>(out_);
  const T* a = static_cast<const T*>(a_);
  const T* b = static_cast<const T*>(b_);
  for (size_t i = 0; i < n; ++i) out[i] = Op::apply(a[i], b[i]);
}

struct Half {
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float f) { return float_to_half(f); }
};
struct BFloat {
  static float load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(float f) { return float_to_bf16(f); }
};

template <class Format, class Op>
void reduce_16bit(void* out_, const void* a_, const void* b_, size_t n) {
  uint16_t* out = static_cast<uint16_t*>(out_);
  const uint16_t* a = static_cast<const uint16_t*>(a_);
  const uint16_t* b = static_cast<const uint16_t*>(b_);
  for (size_t i = 0; i < n; ++i) {
    out[i] = Format::store(Op::apply(Format::load(a[i]), Format::load(b[i])));
  }
}

template <class Op>
ReduceFn for_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return &reduce_native<float, Op>;
    case DType::i64:
      return &reduce_native<int64_t, Op>;
    case DType::f16:
      return &reduce_16bit<Half, Op>;
    case DType::bf16:
      return &reduce_16bit<BFloat, Op>;
    case DType::u8:
      break;
  }
  return nullptr;
}

template <class Format>
void divide_16bit(uint16_t* p, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) p[i] = Format::store(Format::load(p[i]) / divisor);
}

}  // namespace

bool is_reducible(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::i64;
}

ReduceFn reduce_function(DType dtype, ReduceOp op, const char* what) {
  DPAR_CHECK(is_reducible(dtype), what, ": cannot reduce ", dtype_name(dtype),
             " tensors (supported: f32, f16, bf16, i64)");
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return for_dtype<Sum>(dtype);
    case ReduceOp::Max:
      return for_dtype<Max>(dtype);
    case ReduceOp::Min:
      return for_dtype<Min>(dtype);
  }
  DPAR_FAIL(what, ": unknown reduce op ", static_cast<int>(op));
}

void divide_in_place(void* data, size_t n, DType dtype, int64_t divisor) {
  if (divisor == 1) return;
  switch (dtype) {
    case DType::f32: {
      float* p = static_cast<float*>(data);
      const float d = static_cast<float>(divisor);
      // Division, not multiplication by 1/d, so that e.g. 3/3 is exactly 1.
      for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
      return;
    }
    case DType::i64: {
      int64_t* p = static_cast<int64_t*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = p[i] / divisor;
      return;
    }
    case DType::f16:
      divide_16bit<Half>(static_cast<uint16_t*>(data), n, static_cast<float>(divisor));
      return;
    case DType::bf16:
      divide_16bit<BFloat>(static_cast<uint16_t*>(data), n, static_cast<float>(divisor));
      return;
    case DType::u8:
      break;
  }
  DPAR_FAIL("divide_in_place: cannot average ", dtype_name(dtype), " tensors");
}

}  // namespace dpar::dist::detail
