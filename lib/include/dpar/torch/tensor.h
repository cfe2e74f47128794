#pragma once
// Zero-copy views between libtorch tensors and dpar tensors (dpar::torch, built with libtorch).
//
// A view shares the other tensor's memory and keeps it alive: to_dpar(t) holds t's storage, and
// to_torch(d) holds d's storage, so either side may outlive the other. Shape, strides, storage
// offset and device (CPU, or the same CUDA device pointer) are kept; nothing is copied. Autograd
// state is not carried across: a view is plain data (as torch's from_blob is).
//
// dtype map: float32 <-> f32, float16 <-> f16, bfloat16 <-> bf16, int64 <-> i64, uint8 <-> u8.
// Anything else (double, int32, bool, complex, ...), sparse, quantized or other non-strided
// tensors, and devices other than CPU and CUDA are a dpar::Error naming what cannot be viewed.
//
// Note on names: this namespace is dpar::torch, so code inside `namespace dpar` (or after
// `using namespace dpar;`) must spell libtorch's namespace as ::torch.
#include <torch/types.h>

#include "dpar/tensor/tensor.h"

namespace dpar::torch {

// The dpar dtype of a libtorch scalar type; throws naming the type when dpar has none.
DType dtype_of(c10::ScalarType type);
c10::ScalarType scalar_type_of(DType type);

// A dpar tensor over t's memory (t must be defined and strided).
Tensor to_dpar(const at::Tensor& t);
// A libtorch tensor over d's memory (d must be defined).
at::Tensor to_torch(const Tensor& d);

}  // namespace dpar::torch
