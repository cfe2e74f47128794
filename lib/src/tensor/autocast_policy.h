#pragma once
// What amp::Autocast does to the dtypes between ops (see dpar/tensor/autocast.h).
#include "dpar/core/dtype.h"
#include "dpar/tensor/tensor.h"

namespace dpar::detail {

// Whether an autocast op (conv2d, linear, matmul) hands its result back in the dtype it
// computed in (f16/bf16), as torch.autocast does, so the activations between ops stay in half
// precision: the default. DPAR_AMP_ACTIVATIONS=f32 casts every result back to f32 instead (the
// older behaviour: only the tensor-core ops run in half precision).
bool autocast_half_outputs();

// The dtype an autocast op returns after computing in `compute`.
inline DType autocast_output_dtype(DType compute) {
  return compute != DType::f32 && autocast_half_outputs() ? compute : DType::f32;
}

// Whether the pointwise, normalisation and pooling ops take t's dtype: f32 on any device, bf16
// on any device (on the CPU: amp::Autocast's bf16 activations), f16 on CUDA. They compute in
// f32 and round once at the store.
inline bool elementwise_dtype_ok(const Tensor& t) {
  return t.dtype() == DType::f32 || t.dtype() == DType::bf16 ||
         (t.device().is_cuda() && t.dtype() == DType::f16);
}

// An f16/bf16 tensor as f32, recorded by autograd (its gradient goes back in its own dtype),
// for the ops that compute in f32 only, as torch.autocast's fp32 list does (softmax and the
// losses, layer and group norm, reductions, attention, window pooling, indexing); any other
// tensor is returned as it is.
inline Tensor f32_from_half(const Tensor& t) {
  const bool half = t.defined() && (t.dtype() == DType::f16 || t.dtype() == DType::bf16);
  return half ? t.to(DType::f32) : t;
}

}  // namespace dpar::detail
