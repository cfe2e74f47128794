#pragma once
// Host-side operand checks of the CUDA optimizer kernels (optim.cu, optim_multi.cu): the
// kernels run over flat memory, so every operand must be f32 and laid out like the parameter.
#include "dpar/core/error.h"
#include "dpar/tensor/tensor.h"

namespace dpar::cuda {

// Same memory order as param: equal strides wherever the size is not 1 (a size-1 dim's stride
// does not move any element).
inline bool same_layout(const Tensor& t, const Tensor& param) {
  if (t.shape() != param.shape()) return false;
  for (size_t d = 0; d < t.shape().size(); ++d) {
    if (t.shape()[d] != 1 && t.strides()[d] != param.strides()[d]) return false;
  }
  return true;
}

// Operand `t` of `op` must be an f32 tensor laid out like param.
inline void check_operand(const Tensor& t, const Tensor& param, const char* op, const char* name) {
  DPAR_CHECK(t.dtype() == DType::f32 && t.device() == param.device() && same_layout(t, param), op,
             " on CUDA: ", name, " must be f32 with param's shape ", param.shape(), ", strides ",
             param.strides(), " and device ", param.device(), "; got ", t.str(), " strides ",
             t.strides());
}

inline void check_param(const Tensor& param, const char* op) {
  DPAR_CHECK(param.dtype() == DType::f32 && param.is_dense(), op,
             " on CUDA needs a dense f32 parameter, got ", param.str(), " strides ",
             param.strides());
}

inline float* f32(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

}  // namespace dpar::cuda
