// CUDA kernels for pointwise unary ops, activations and dropout masks (f32). The formulas are
// the CPU backend's (tensor/cpu/unary_kernels.cpp), including NaN propagation and the values
// at the kinks; only exp/log may differ from the host's libm by an ulp or two.
#include <cstdint>
#include <type_traits>

#include "tensor/activation_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/strided_indexer.cuh"

namespace dpar::cuda {
namespace {

using kernels::UnaryOp;

// std::max/std::min exactly (not fmaxf/fminf, which drop a NaN operand): hardswish of NaN is
// NaN on the CPU.
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float std_min(float a, float b) { return b < a ? b : a; }

template <UnaryOp Op>
__device__ __forceinline__ float forward(float x) {
  if constexpr (Op == UnaryOp::exp) {
    return expf(x);
  } else if constexpr (Op == UnaryOp::log) {
    return logf(x);
  } else if constexpr (Op == UnaryOp::sqrt) {
    return sqrtf(x);
  } else if constexpr (Op == UnaryOp::square) {
    return x * x;
  } else if constexpr (Op == UnaryOp::relu) {
    return x < 0.f ? 0.f : x;
  } else if constexpr (Op == UnaryOp::hardswish) {
    return x * std_min(std_max(x + 3.f, 0.f), 6.f) / 6.f;
  } else if constexpr (Op == UnaryOp::hardsigmoid) {
    return std_min(std_max(x + 3.f, 0.f), 6.f) / 6.f;
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    return 1.f / (1.f + expf(-x));
  }
}

// g: incoming gradient; s: the saved tensor (output or input, see unary_saves_output).
template <UnaryOp Op>
__device__ __forceinline__ float backward(float g, float s) {
  if constexpr (Op == UnaryOp::exp) {
    return g * s;
  } else if constexpr (Op == UnaryOp::log) {
    return g / s;
  } else if constexpr (Op == UnaryOp::sqrt) {
    return g / (2.f * s);
  } else if constexpr (Op == UnaryOp::square) {
    return g * (2.f * s);
  } else if constexpr (Op == UnaryOp::relu) {
    return s <= 0.f ? 0.f : g;
  } else if constexpr (Op == UnaryOp::hardswish) {
    // 0 below -3, x/3 + 1/2 on [-3, 3] (kinks included), 1 above.
    return s < -3.f ? 0.f : (s <= 3.f ? g * (s / 3.f + 0.5f) : g);
  } else if constexpr (Op == UnaryOp::hardsigmoid) {
    // 1/6 strictly inside (-3, 3), 0 elsewhere, kinks included.
    return s > -3.f && s < 3.f ? g * (1.f / 6.f) : 0.f;
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    return g * (1.f - s) * s;
  }
}

template <UnaryOp Op>
__global__ void unary_flat_kernel(const float* x, float* out, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { out[i] = forward<Op>(x[i]); }
}

template <UnaryOp Op>
__global__ void unary_strided_kernel(const float* x, float* out, StridedIndexer<2> ix, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = forward<Op>(x[off[1]]);
  }
}

template <UnaryOp Op>
__global__ void unary_backward_flat_kernel(const float* g, const float* s, float* out, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { out[i] = backward<Op>(g[i], s[i]); }
}

template <UnaryOp Op>
__global__ void unary_backward_strided_kernel(const float* g, const float* s, float* out,
                                              StridedIndexer<3> ix, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = backward<Op>(g[off[1]], s[off[2]]);
  }
}

// Calls fn(std::integral_constant<UnaryOp, op>) so kernels are instantiated per op.
template <class Fn>
void dispatch(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::exp:
      return fn(std::integral_constant<UnaryOp, UnaryOp::exp>{});
    case UnaryOp::log:
      return fn(std::integral_constant<UnaryOp, UnaryOp::log>{});
    case UnaryOp::sqrt:
      return fn(std::integral_constant<UnaryOp, UnaryOp::sqrt>{});
    case UnaryOp::square:
      return fn(std::integral_constant<UnaryOp, UnaryOp::square>{});
    case UnaryOp::relu:
      return fn(std::integral_constant<UnaryOp, UnaryOp::relu>{});
    case UnaryOp::hardswish:
      return fn(std::integral_constant<UnaryOp, UnaryOp::hardswish>{});
    case UnaryOp::hardsigmoid:
      return fn(std::integral_constant<UnaryOp, UnaryOp::hardsigmoid>{});
    case UnaryOp::sigmoid:
      return fn(std::integral_constant<UnaryOp, UnaryOp::sigmoid>{});
  }
  DPAR_FAIL("unary on CUDA: unknown op ", static_cast<int>(op));
}

void require_f32(const Tensor& t, const char* op, const char* which) {
  DPAR_CHECK(t.dtype() == DType::f32, op, " on CUDA supports f32; ", which, " has dtype ",
             t.dtype());
}

void unary_cuda(UnaryOp op, const Tensor& x, Tensor& out) {
  DeviceGuard guard(out.device());
  require_f32(x, "unary", "x");
  require_f32(out, "unary", "out");
  const int64_t n = out.numel();
  if (n == 0) return;
  const float* px = static_cast<const float*>(x.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  const bool flat = x.strides() == out.strides() && out.is_dense();
  const Shape* strides[2] = {&out.strides(), &x.strides()};
  const StridedIndexer<2> ix = flat ? StridedIndexer<2>{} : make_indexer<2>(out.shape(), strides);
  const cudaStream_t stream = current_stream();
  dispatch(op, [&](auto tag) {
    constexpr UnaryOp kOp = decltype(tag)::value;
    if (flat) {
      unary_flat_kernel<kOp><<<blocks_for(n), kThreads, 0, stream>>>(px, po, n);
    } else {
      unary_strided_kernel<kOp><<<blocks_for(n), kThreads, 0, stream>>>(px, po, ix, n);
    }
  });
  check_launch("unary");
}

void unary_backward_cuda(UnaryOp op, const Tensor& grad, const Tensor& saved, Tensor& grad_in) {
  DeviceGuard guard(grad_in.device());
  require_f32(grad, "unary_backward", "grad");
  require_f32(saved, "unary_backward", "saved");
  require_f32(grad_in, "unary_backward", "grad_in");
  const int64_t n = grad_in.numel();
  if (n == 0) return;
  const float* pg = static_cast<const float*>(grad.raw_data());
  const float* ps = static_cast<const float*>(saved.raw_data());
  float* po = static_cast<float*>(grad_in.raw_data());
  const bool flat = grad.strides() == grad_in.strides() && saved.strides() == grad_in.strides() &&
                    grad_in.is_dense();
  const Shape* strides[3] = {&grad_in.strides(), &grad.strides(), &saved.strides()};
  const StridedIndexer<3> ix =
      flat ? StridedIndexer<3>{} : make_indexer<3>(grad_in.shape(), strides);
  const cudaStream_t stream = current_stream();
  dispatch(op, [&](auto tag) {
    constexpr UnaryOp kOp = decltype(tag)::value;
    if (flat) {
      unary_backward_flat_kernel<kOp><<<blocks_for(n), kThreads, 0, stream>>>(pg, ps, po, n);
    } else {
      unary_backward_strided_kernel<kOp><<<blocks_for(n), kThreads, 0, stream>>>(pg, ps, po, ix, n);
    }
  });
  check_launch("unary_backward");
}

// out = x * (mask * scale): a dropped NaN stays NaN, as on the CPU.
__global__ void masked_scale_flat_kernel(const float* x, const uint8_t* mask, float scale,
                                         float* out, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { out[i] = x[i] * (static_cast<float>(mask[i]) * scale); }
}

__global__ void masked_scale_strided_kernel(const float* x, const uint8_t* mask, float scale,
                                            float* out, StridedIndexer<3> ix, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = x[off[1]] * (static_cast<float>(mask[off[2]]) * scale);
  }
}

void masked_scale_cuda(const Tensor& x, const Tensor& mask, float scale, Tensor& out) {
  DeviceGuard guard(out.device());
  require_f32(x, "masked_scale", "x");
  require_f32(out, "masked_scale", "out");
  DPAR_CHECK(mask.dtype() == DType::u8, "masked_scale on CUDA needs a u8 mask, got ", mask.dtype());
  const int64_t n = out.numel();
  if (n == 0) return;
  const float* px = static_cast<const float*>(x.raw_data());
  const uint8_t* pm = static_cast<const uint8_t*>(mask.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  if (x.strides() == out.strides() && mask.strides() == out.strides() && out.is_dense()) {
    masked_scale_flat_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(px, pm, scale, po,
                                                                               n);
  } else {
    const Shape* strides[3] = {&out.strides(), &x.strides(), &mask.strides()};
    const StridedIndexer<3> ix = make_indexer<3>(out.shape(), strides);
    masked_scale_strided_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(px, pm, scale, po,
                                                                                  ix, n);
  }
  check_launch("masked_scale");
}

}  // namespace

void register_unary_kernels() {
  kernels::unary.set(DeviceType::CUDA, &unary_cuda);
  kernels::unary_backward.set(DeviceType::CUDA, &unary_backward_cuda);
  kernels::masked_scale.set(DeviceType::CUDA, &masked_scale_cuda);
}

}  // namespace dpar::cuda
