// CPU kernels for pointwise unary ops, activations and dropout masks. The per-element formulas
// (PyTorch's CPU ones) are shared with the CUDA kernels: tensor/unary_math.h.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/activation_kernels.h"
#include "tensor/cpu/float_types.h"
#include "tensor/cpu/isa.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/unary_math.h"

namespace dpar::cpu {
namespace {

using kernels::UnaryOp;

constexpr int64_t kParallelThreshold = 65536;

// The dense loops, once per ISA (cpu/isa.h): GELU and the other exp/erf formulas are compute
// bound, and 16 lanes instead of 4 pay for themselves.
// clang-format off
#define DPAR_UNARY_FLAT_LOOPS(SUFFIX, TARGET)                                              \
  template <UnaryOp Op, class T>                                                          \
  TARGET void unary_flat##SUFFIX(const T* px, T* po, int64_t n, kernels::UnaryArgs args) { \
    _Pragma("omp parallel for schedule(static) if (n > kParallelThreshold)")              \
    for (int64_t i = 0; i < n; ++i)                                                       \
      po[i] = from_float<T>(kernels::unary_value<Op>(to_float(px[i]), args));             \
  }                                                                                       \
  template <UnaryOp Op, class T>                                                          \
  TARGET void unary_grad_flat##SUFFIX(const T* pg, const T* ps, T* po, int64_t n,         \
                                      kernels::UnaryArgs args) {                          \
    _Pragma("omp parallel for schedule(static) if (n > kParallelThreshold)")              \
    for (int64_t i = 0; i < n; ++i)                                                       \
      po[i] = from_float<T>(kernels::unary_grad<Op>(to_float(pg[i]), to_float(ps[i]), args)); \
  }
DPAR_UNARY_FLAT_LOOPS(_baseline, )
DPAR_UNARY_FLAT_LOOPS(_avx2, DPAR_TARGET_AVX2)
DPAR_UNARY_FLAT_LOOPS(_avx512, DPAR_TARGET_AVX512)
// clang-format on
#undef DPAR_UNARY_FLAT_LOOPS

// Streaming stores (UnaryArgs::stream_output) for outputs of at least this size: twice a core's
// L2 here, so the output could not have stayed in cache for its reader anyway. On ViT-Tiny's
// GELU ([4160, 768], 12.8 MB, one core) the forward went from ~10.5 to ~6.8 ms per step and the
// step ~1.5% faster. Writing lines that are still cached this way is slower than plain stores
// (a backward's output lands in memory just freed, so only forwards ask).
constexpr int64_t kStreamMinBytes = int64_t{4} << 20;
constexpr int kStreamBlock = 64;  // floats per step: four cache lines

#if DPAR_HAVE_ISA_CLONES
// unary_flat_avx512 with each 64-float block computed into a stack buffer in L1 (the same
// formula, so the same bits) and copied out by streaming stores; out must start on a cache line.
template <UnaryOp Op>
DPAR_TARGET_AVX512 void unary_flat_streaming_avx512(const float* px, float* po, int64_t n,
                                                    kernels::UnaryArgs args) {
  const int64_t blocks = n / kStreamBlock;
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < blocks; ++b) {
      alignas(64) float values[kStreamBlock];
      const float* x = px + b * kStreamBlock;
      for (int i = 0; i < kStreamBlock; ++i) values[i] = kernels::unary_value<Op>(x[i], args);
      for (int i = 0; i < kStreamBlock; i += 16) {
        _mm512_stream_ps(po + b * kStreamBlock + i, _mm512_load_ps(values + i));
      }
    }
    // Streaming stores are weakly ordered: each thread fences its own before the region ends.
    _mm_sfence();
  }
  for (int64_t i = blocks * kStreamBlock; i < n; ++i) po[i] = kernels::unary_value<Op>(px[i], args);
}
#endif

template <UnaryOp Op, class T>
void unary_flat(const T* px, T* po, int64_t n, kernels::UnaryArgs args) {
  switch (cpu_isa()) {
    case Isa::avx512:
#if DPAR_HAVE_ISA_CLONES
      if constexpr (std::is_same_v<T, float>) {
        if (args.stream_output && n * static_cast<int64_t>(sizeof(float)) >= kStreamMinBytes &&
            reinterpret_cast<uintptr_t>(po) % 64 == 0) {
          return unary_flat_streaming_avx512<Op>(px, po, n, args);
        }
      }
#endif
      return unary_flat_avx512<Op, T>(px, po, n, args);
    case Isa::avx2:
      return unary_flat_avx2<Op, T>(px, po, n, args);
    case Isa::baseline:
      break;
  }
  unary_flat_baseline<Op, T>(px, po, n, args);
}

template <UnaryOp Op, class T>
void unary_grad_flat(const T* pg, const T* ps, T* po, int64_t n, kernels::UnaryArgs args) {
  switch (cpu_isa()) {
    case Isa::avx512:
      return unary_grad_flat_avx512<Op, T>(pg, ps, po, n, args);
    case Isa::avx2:
      return unary_grad_flat_avx2<Op, T>(pg, ps, po, n, args);
    case Isa::baseline:
      break;
  }
  unary_grad_flat_baseline<Op, T>(pg, ps, po, n, args);
}

template <UnaryOp Op, class T>
void unary_typed(const Tensor& x, Tensor& out, kernels::UnaryArgs args) {
  const T* px = data_as<const T>(x);
  T* po = data_as<T>(out);
  if (x.strides() == out.strides() && out.is_dense()) {
    unary_flat<Op, T>(px, po, out.numel(), args);
    return;
  }
  auto f = [&](T v) { return from_float<T>(kernels::unary_value<Op>(to_float(v), args)); };
  for_each_row_parallel<2>(
      out.shape(), {&out.strides(), &x.strides()}, kParallelThreshold,
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        T* o = po + off[0];
        const T* xi = px + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = f(xi[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(xi[i * st[1]]);
        }
      });
}

template <UnaryOp Op, class T>
void unary_backward_typed(const Tensor& grad, const Tensor& saved, Tensor& grad_in,
                          kernels::UnaryArgs args) {
  const T* pg = data_as<const T>(grad);
  const T* ps = data_as<const T>(saved);
  T* po = data_as<T>(grad_in);
  if (grad.strides() == grad_in.strides() && saved.strides() == grad_in.strides() &&
      grad_in.is_dense()) {
    unary_grad_flat<Op, T>(pg, ps, po, grad_in.numel(), args);
    return;
  }
  auto f = [&](T g, T s) {
    return from_float<T>(kernels::unary_grad<Op>(to_float(g), to_float(s), args));
  };
  for_each_row_parallel<3>(
      grad_in.shape(), {&grad_in.strides(), &grad.strides(), &saved.strides()}, kParallelThreshold,
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        T* o = po + off[0];
        const T* g = pg + off[1];
        const T* s = ps + off[2];
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = f(g[i], s[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(g[i * st[1]], s[i * st[2]]);
        }
      });
}

void unary_cpu(UnaryOp op, const Tensor& x, Tensor& out, kernels::UnaryArgs args) {
  require_same_float("unary", out, x, "the input");
  visit_float_dtype(out.dtype(), "unary", [&](auto type) {
    using T = typename decltype(type)::type;
    kernels::dispatch_unary(op,
                            [&](auto tag) { unary_typed<decltype(tag)::value, T>(x, out, args); });
  });
}

void unary_backward_cpu(UnaryOp op, const Tensor& grad, const Tensor& saved, Tensor& grad_in,
                        kernels::UnaryArgs args) {
  require_same_float("unary backward", grad_in, grad, "the gradient");
  require_same_float("unary backward", grad_in, saved, "the saved tensor");
  visit_float_dtype(grad_in.dtype(), "unary backward", [&](auto type) {
    using T = typename decltype(type)::type;
    kernels::dispatch_unary(op, [&](auto tag) {
      unary_backward_typed<decltype(tag)::value, T>(grad, saved, grad_in, args);
    });
  });
}

// out = x * (mask * scale): a dropped NaN stays NaN, as with PyTorch's x * noise.
template <class T>
void masked_scale_typed(const Tensor& x, const Tensor& mask, float scale, Tensor& out) {
  const T* px = data_as<const T>(x);
  const uint8_t* pm = static_cast<const uint8_t*>(mask.raw_data());
  T* po = data_as<T>(out);
  auto f = [scale](T v, uint8_t m) {
    return from_float<T>(to_float(v) * (static_cast<float>(m) * scale));
  };
  if (x.strides() == out.strides() && mask.strides() == out.strides() && out.is_dense()) {
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) po[i] = f(px[i], pm[i]);
    return;
  }
  for_each_row_parallel<3>(
      out.shape(), {&out.strides(), &x.strides(), &mask.strides()}, kParallelThreshold,
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        T* o = po + off[0];
        const T* xi = px + off[1];
        const uint8_t* m = pm + off[2];
        for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(xi[i * st[1]], m[i * st[2]]);
      });
}

void masked_scale_cpu(const Tensor& x, const Tensor& mask, float scale, Tensor& out) {
  require_same_float("dropout", out, x, "the input");
  visit_float_dtype(out.dtype(), "dropout", [&](auto tag) {
    masked_scale_typed<typename decltype(tag)::type>(x, mask, scale, out);
  });
}

}  // namespace

void register_unary_kernels() {
  kernels::unary.set(DeviceType::CPU, &unary_cpu);
  kernels::unary_backward.set(DeviceType::CPU, &unary_backward_cpu);
  kernels::masked_scale.set(DeviceType::CPU, &masked_scale_cpu);
}

}  // namespace dpar::cpu
