// CUDA kernels for pointwise unary ops, activations and dropout masks, on f32 and on f16/bf16
// (computed in f32, rounded once at the store: amp::Autocast's half-precision activations;
// every operand of one call has the same dtype). The per-element
// formulas are the CPU backend's, from one header (tensor/unary_math.h), including NaN
// propagation and the values at the kinks; only exp/log may differ from the host's libm by an
// ulp or two.
#include <cstdint>
#include <type_traits>

#include "tensor/activation_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/float_types.cuh"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/unary_math.h"

namespace dpar::cuda {
namespace {

using kernels::UnaryOp;

template <UnaryOp Op, class T>
__global__ void unary_flat_kernel(const T* x, T* out, int64_t n, kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    out[i] = from_float<T>(kernels::unary_value<Op>(to_float(x[i]), a));
  }
}

template <UnaryOp Op, class T>
__global__ void unary_strided_kernel(const T* x, T* out, StridedIndexer<2> ix, int64_t n,
                                     kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = from_float<T>(kernels::unary_value<Op>(to_float(x[off[1]]), a));
  }
}

template <UnaryOp Op, class T>
__global__ void unary_backward_flat_kernel(const T* g, const T* s, T* out, int64_t n,
                                           kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    out[i] = from_float<T>(kernels::unary_grad<Op>(to_float(g[i]), to_float(s[i]), a));
  }
}

template <UnaryOp Op, class T>
__global__ void unary_backward_strided_kernel(const T* g, const T* s, T* out, StridedIndexer<3> ix,
                                              int64_t n, kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] =
        from_float<T>(kernels::unary_grad<Op>(to_float(g[off[1]]), to_float(s[off[2]]), a));
  }
}

void unary_cuda(UnaryOp op, const Tensor& x, Tensor& out, kernels::UnaryArgs args) {
  DeviceGuard guard(out.device());
  require_same_float("unary", out, x, "x");
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool flat = x.strides() == out.strides() && out.is_dense();
  const Shape* strides[2] = {&out.strides(), &x.strides()};
  const StridedIndexer<2> ix = flat ? StridedIndexer<2>{} : make_indexer<2>(out.shape(), strides);
  const cudaStream_t stream = current_stream();
  visit_float_dtype(out.dtype(), "unary", [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    const T* px = data_as<T>(x);
    T* po = data_as<T>(out);
    kernels::dispatch_unary(op, [&](auto tag) {
      constexpr UnaryOp kOp = decltype(tag)::value;
      if (flat) {
        unary_flat_kernel<kOp, T><<<blocks_for(n), kThreads, 0, stream>>>(px, po, n, args);
      } else {
        unary_strided_kernel<kOp, T><<<blocks_for(n), kThreads, 0, stream>>>(px, po, ix, n, args);
      }
    });
  });
  check_launch("unary");
}

void unary_backward_cuda(UnaryOp op, const Tensor& grad, const Tensor& saved, Tensor& grad_in,
                         kernels::UnaryArgs args) {
  DeviceGuard guard(grad_in.device());
  require_same_float("unary_backward", grad_in, grad, "grad");
  require_same_float("unary_backward", grad_in, saved, "saved");
  const int64_t n = grad_in.numel();
  if (n == 0) return;
  const bool flat = grad.strides() == grad_in.strides() && saved.strides() == grad_in.strides() &&
                    grad_in.is_dense();
  const Shape* strides[3] = {&grad_in.strides(), &grad.strides(), &saved.strides()};
  const StridedIndexer<3> ix =
      flat ? StridedIndexer<3>{} : make_indexer<3>(grad_in.shape(), strides);
  const cudaStream_t stream = current_stream();
  visit_float_dtype(grad_in.dtype(), "unary_backward", [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    const T* pg = data_as<T>(grad);
    const T* ps = data_as<T>(saved);
    T* po = data_as<T>(grad_in);
    kernels::dispatch_unary(op, [&](auto tag) {
      constexpr UnaryOp kOp = decltype(tag)::value;
      if (flat) {
        unary_backward_flat_kernel<kOp, T>
            <<<blocks_for(n), kThreads, 0, stream>>>(pg, ps, po, n, args);
      } else {
        unary_backward_strided_kernel<kOp, T>
            <<<blocks_for(n), kThreads, 0, stream>>>(pg, ps, po, ix, n, args);
      }
    });
  });
  check_launch("unary_backward");
}

// out = x * (mask * scale): a dropped NaN stays NaN, as on the CPU.
template <class T>
__global__ void masked_scale_flat_kernel(const T* x, const uint8_t* mask, float scale, T* out,
                                         int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    out[i] = from_float<T>(to_float(x[i]) * (static_cast<float>(mask[i]) * scale));
  }
}

template <class T>
__global__ void masked_scale_strided_kernel(const T* x, const uint8_t* mask, float scale, T* out,
                                            StridedIndexer<3> ix, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = from_float<T>(to_float(x[off[1]]) * (static_cast<float>(mask[off[2]]) * scale));
  }
}

void masked_scale_cuda(const Tensor& x, const Tensor& mask, float scale, Tensor& out) {
  DeviceGuard guard(out.device());
  require_same_float("masked_scale", out, x, "x");
  DPAR_CHECK(mask.dtype() == DType::u8, "masked_scale on CUDA needs a u8 mask, got ", mask.dtype());
  const int64_t n = out.numel();
  if (n == 0) return;
  const uint8_t* pm = static_cast<const uint8_t*>(mask.raw_data());
  visit_float_dtype(out.dtype(), "masked_scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = data_as<T>(x);
    T* po = data_as<T>(out);
    if (x.strides() == out.strides() && mask.strides() == out.strides() && out.is_dense()) {
      masked_scale_flat_kernel<T>
          <<<blocks_for(n), kThreads, 0, current_stream()>>>(px, pm, scale, po, n);
    } else {
      const Shape* strides[3] = {&out.strides(), &x.strides(), &mask.strides()};
      const StridedIndexer<3> ix = make_indexer<3>(out.shape(), strides);
      masked_scale_strided_kernel<T>
          <<<blocks_for(n), kThreads, 0, current_stream()>>>(px, pm, scale, po, ix, n);
    }
  });
  check_launch("masked_scale");
}

}  // namespace

void register_unary_kernels() {
  kernels::unary.set(DeviceType::CUDA, &unary_cuda);
  kernels::unary_backward.set(DeviceType::CUDA, &unary_backward_cuda);
  kernels::masked_scale.set(DeviceType::CUDA, &masked_scale_cuda);
}

}  // namespace dpar::cuda
