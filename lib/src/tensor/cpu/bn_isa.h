#pragma once
// bn_loops.h's f32 loops compiled for AVX2+FMA and for AVX-512 (bn_isa_kernels.inc, built by
// bn_avx2_kernels.cpp and bn_avx512_kernels.cpp). Batch norm is most of a CNN step's pointwise
// work, and the fused forward's Hardswish divides: the baseline build's 4-lane SSE2 loops made
// the fused forward slower than oneDNN's batch norm plus the (AVX2-cloned) activation after it.
// Call the avx2 ones only where cpu_isa() >= Isa::avx2 and the avx512 ones where it is avx512.
#include "dpar/tensor/ops.h"
#include "dpar/tensor/tensor.h"

#define DPAR_DECLARE_BN_ISA_KERNELS                                                              \
  void batch_norm_forward_f32(const Tensor& x, const Tensor& weight, const Tensor& bias,         \
                              Tensor& mean, Tensor& var, bool use_batch_stats, double eps,       \
                              Activation act, Tensor& y, Tensor& z);                             \
  void batch_norm_backward_from_output_f32(                                                      \
      const Tensor& y, const Tensor& dz, const Tensor& weight, const Tensor& bias,               \
      const Tensor& var, bool use_batch_stats, double eps, Activation act, Tensor& dx,           \
      Tensor& dweight, Tensor& dbias);                                                           \
  void batch_norm_act_backward_f32(const Tensor& x, const Tensor& dz, const Tensor& weight,      \
                                   const Tensor& bias, const Tensor& mean, const Tensor& var,    \
                                   bool use_batch_stats, double eps, Activation act, Tensor& dx, \
                                   Tensor& dweight, Tensor& dbias);

namespace dpar::cpu::avx2 {
DPAR_DECLARE_BN_ISA_KERNELS
}  // namespace dpar::cpu::avx2

namespace dpar::cpu::avx512 {
DPAR_DECLARE_BN_ISA_KERNELS
}  // namespace dpar::cpu::avx512

#undef DPAR_DECLARE_BN_ISA_KERNELS
