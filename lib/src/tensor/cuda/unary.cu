// CUDA kernels for pointwise unary ops, activations and dropout masks (f32). The per-element
// formulas are the CPU backend's, from one header (tensor/unary_math.h), including NaN
// propagation and the values at the kinks; only exp/log may differ from the host's libm by an
// ulp or two.
#include <cstdint>
#include <type_traits>

#include "tensor/activation_kernels.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/unary_math.h"

namespace dpar::cuda {
namespace {

using kernels::UnaryOp;

template <UnaryOp Op>
__global__ void unary_flat_kernel(const float* x, float* out, int64_t n, kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { out[i] = kernels::unary_value<Op>(x[i], a); }
}

template <UnaryOp Op>
__global__ void unary_strided_kernel(const float* x, float* out, StridedIndexer<2> ix, int64_t n,
                                     kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = kernels::unary_value<Op>(x[off[1]], a);
  }
}

template <UnaryOp Op>
__global__ void unary_backward_flat_kernel(const float* g, const float* s, float* out, int64_t n,
                                           kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) { out[i] = kernels::unary_grad<Op>(g[i], s[i], a); }
}

template <UnaryOp Op>
__global__ void unary_backward_strided_kernel(const float* g, const float* s, float* out,
                                              StridedIndexer<3> ix, int64_t n,
                                              kernels::UnaryArgs a) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = kernels::unary_grad<Op>(g[off[1]], s[off[2]], a);
  }
}

void require_f32(const Tensor& t, const char* op, const char* which) {
  DPAR_CHECK(t.dtype() == DType::f32, op, " on CUDA supports f32; ", which, " has dtype ",
             t.dtype());
}

void unary_cuda(UnaryOp op, const Tensor& x, Tensor& out, kernels::UnaryArgs args) {
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
  kernels::dispatch_unary(op, [&](auto tag) {
    constexpr UnaryOp kOp = decltype(tag)::value;
    if (flat) {
      unary_flat_kernel<kOp><<<blocks_for(n), kThreads, 0, stream>>>(px, po, n, args);
    } else {
      unary_strided_kernel<kOp><<<blocks_for(n), kThreads, 0, stream>>>(px, po, ix, n, args);
    }
  });
  check_launch("unary");
}

void unary_backward_cuda(UnaryOp op, const Tensor& grad, const Tensor& saved, Tensor& grad_in,
                         kernels::UnaryArgs args) {
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
  kernels::dispatch_unary(op, [&](auto tag) {
    constexpr UnaryOp kOp = decltype(tag)::value;
    if (flat) {
      unary_backward_flat_kernel<kOp><<<blocks_for(n), kThreads, 0, stream>>>(pg, ps, po, n, args);
    } else {
      unary_backward_strided_kernel<kOp>
          <<<blocks_for(n), kThreads, 0, stream>>>(pg, ps, po, ix, n, args);
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
