#pragma once
// The bf16 kernels compiled for AVX-512 (avx512_bf16_kernels.cpp): the loops of
// tensor/cpu/bn_loops.h and tensor/cpu/elementwise_loops.h for amp::Autocast's bf16
// activations, 16 lanes wide. Widening bf16 to f32 and rounding back cost the x86-64 baseline
// build (4 lanes, SSE2) more than the f32 loops' whole work: MobileNetV3-small's bf16 training
// step at batch 16 took 147 ms on the baseline loops against 142 ms in f32 (oneDNN's bf16
// convolutions notwithstanding), 118 ms with these. Call them only where
// cpu_isa() == Isa::avx512; elsewhere the baseline instantiations of the same templates run.
#include <cstdint>

#include "dpar/tensor/ops.h"
#include "dpar/tensor/tensor.h"
#include "tensor/elementwise_kernels.h"

// BatchNorm's bf16 forward and backward from its output, and the dense f32 -> bf16 cast (round to
// nearest even, for Tensor::to and copy_): declared in both namespaces below.
#define DPAR_DECLARE_BF16_BN_KERNELS                                                        \
  void batch_norm_forward_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias,   \
                               Tensor& mean, Tensor& var, bool use_batch_stats, double eps, \
                               Activation act, Tensor& y, Tensor& z);                       \
  void batch_norm_backward_from_output_bf16(                                                \
      const Tensor& y, const Tensor& dz, const Tensor& weight, const Tensor& bias,          \
      const Tensor& var, bool use_batch_stats, double eps, Activation act, Tensor& dx,      \
      Tensor& dweight, Tensor& dbias);                                                      \
  void convert_f32_to_bf16(const float* from, uint16_t* to, int64_t n);

namespace dpar::cpu::avx512 {

DPAR_DECLARE_BF16_BN_KERNELS
void binary_bf16(kernels::BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
void affine_bf16(const Tensor& a, float alpha, float beta, Tensor& out);
void add_inplace_bf16(Tensor& self, const Tensor& other, float alpha);
void convert_bf16_to_f32(const uint16_t* from, float* to, int64_t n);

}  // namespace dpar::cpu::avx512

// The same batch norm loops for CPUs with AVX512-BF16 (bn_bf16_native_kernels.cpp), rounding
// with its conversion instruction, and the dense f32 -> bf16 cast by it; each gives
// float_to_bf16's bits. Call them only where cpu_has_avx512_bf16().
namespace dpar::cpu::bf16_native {
DPAR_DECLARE_BF16_BN_KERNELS
}  // namespace dpar::cpu::bf16_native

#undef DPAR_DECLARE_BF16_BN_KERNELS
