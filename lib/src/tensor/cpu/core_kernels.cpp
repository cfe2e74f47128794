// CPU copy (any strides, any dtype pair) and fill.
#include "tensor/core_kernels.h"

#include <cstring>

#include "tensor/cpu/avx512_bf16.h"
#include "tensor/cpu/isa.h"
#include "tensor/cpu/strided_loop.h"

namespace dpar::cpu {
namespace {

// Strided copies and fills of at least this many elements are split across the OpenMP team.
constexpr int64_t kMinParallelCopy = 65536;

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <class T>
inline double load(const T& v) {
  return static_cast<double>(v);
}
template <>
inline double load(const Half& v) {
  return half_to_float(v.bits);
}
template <>
inline double load(const BFloat16& v) {
  return bf16_to_float(v.bits);
}

template <class T>
inline T store(double v) {
  return static_cast<T>(v);
}
template <>
inline Half store(double v) {
  return {float_to_half(static_cast<float>(v))};
}
template <>
inline BFloat16 store(double v) {
  return {float_to_bf16(static_cast<float>(v))};
}
// Integer targets truncate toward zero like PyTorch's .to(int64); floats saturate to range.
template <>
inline uint8_t store(double v) {
  return static_cast<uint8_t>(static_cast<int64_t>(v));
}

template <class Fn>
void visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32:
      fn(float{});
      return;
    case DType::f16:
      fn(Half{});
      return;
    case DType::bf16:
      fn(BFloat16{});
      return;
    case DType::i64:
      fn(int64_t{});
      return;
    case DType::u8:
      fn(uint8_t{});
      return;
  }
}

template <class S, class D>
void copy_typed(const Tensor& src, Tensor& dst) {
  const S* s = static_cast<const S*>(src.raw_data());
  D* d = static_cast<D*>(dst.raw_data());
  for_each_row_parallel<2>(
      dst.shape(), {&src.strides(), &dst.strides()}, kMinParallelCopy,
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        const S* sp = s + off[0];
        D* dp = d + off[1];
        if constexpr (std::is_same_v<S, D>) {
          if (st[0] == 1 && st[1] == 1) {
            std::memcpy(dp, sp, static_cast<size_t>(n) * sizeof(S));
            return;
          }
          for (int64_t i = 0; i < n; ++i) dp[i * st[1]] = sp[i * st[0]];
        } else if (st[0] == 1 && st[1] == 1) {
          // Unit strides: a loop the compiler vectorises (f32 <-> bf16 for compressed gradients).
          for (int64_t i = 0; i < n; ++i) dp[i] = store<D>(load(sp[i]));
        } else {
          for (int64_t i = 0; i < n; ++i) dp[i * st[1]] = store<D>(load(sp[i * st[0]]));
        }
      });
}

void copy_cpu(const Tensor& src, Tensor& dst) {
  // Same dtype, same dense layout: one memcpy.
  if (src.dtype() == dst.dtype() && src.strides() == dst.strides() && src.is_dense()) {
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
    return;
  }
  // Dense casts between f32 and bf16 (amp::Autocast's operands and results) 16 lanes wide where
  // the CPU has AVX-512.
  if (src.strides() == dst.strides() && src.is_dense() && cpu_isa() == Isa::avx512) {
    if (src.dtype() == DType::f32 && dst.dtype() == DType::bf16) {
      if (cpu_has_avx512_bf16()) {
        return bf16_native::convert_f32_to_bf16(static_cast<const float*>(src.raw_data()),
                                                static_cast<uint16_t*>(dst.raw_data()),
                                                src.numel());
      }
      return avx512::convert_f32_to_bf16(static_cast<const float*>(src.raw_data()),
                                         static_cast<uint16_t*>(dst.raw_data()), src.numel());
    }
    if (src.dtype() == DType::bf16 && dst.dtype() == DType::f32) {
      return avx512::convert_bf16_to_f32(static_cast<const uint16_t*>(src.raw_data()),
                                         static_cast<float*>(dst.raw_data()), src.numel());
    }
  }
  visit_dtype(src.dtype(), [&](auto s) {
    visit_dtype(dst.dtype(), [&](auto d) { copy_typed<decltype(s), decltype(d)>(src, dst); });
  });
}

void fill_cpu(Tensor& dst, double value) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = store<T>(value);
    T* d = static_cast<T*>(dst.raw_data());
    const Shape* strides = &dst.strides();
    for_each_row_parallel<1>(
        dst.shape(), {strides}, kMinParallelCopy,
        [&](const std::array<int64_t, 1>& off, int64_t n, const std::array<int64_t, 1>& st) {
          T* p = d + off[0];
          for (int64_t i = 0; i < n; ++i) p[i * st[0]] = v;
        });
  });
}

void count_up_cpu(Tensor& counter) {
  DPAR_CHECK(counter.dtype() == DType::i64 && counter.is_dense(),
             "count_up: expected a dense i64 tensor, got ", counter.dtype());
  int64_t* p = counter.data<int64_t>();
  for (int64_t i = 0; i < counter.numel(); ++i) ++p[i];
}

}  // namespace

void register_core_kernels() {
  kernels::copy.set(DeviceType::CPU, &copy_cpu);
  kernels::fill.set(DeviceType::CPU, &fill_cpu);
  kernels::count_up.set(DeviceType::CPU, &count_up_cpu);
}

}  // namespace dpar::cpu
