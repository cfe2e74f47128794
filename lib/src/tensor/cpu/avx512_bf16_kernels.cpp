// The bf16 loops of bn_loops.h and elementwise_loops.h compiled for AVX-512 (see avx512_bf16.h).
// Every header those two include comes first, so that the target region below defines only
// their loops and the entry points: a function defined before it (the standard library's,
// dpar's inline helpers) keeps the baseline ISA even where it is instantiated or inlined here,
// and the loop headers' unnamed namespace keeps these copies out of the linker's reach of the
// baseline ones.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/avx512_bf16.h"
#include "tensor/cpu/float_types.h"
#include "tensor/cpu/isa.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/elementwise_kernels.h"
#include "tensor/nn_kernels.h"
#include "tensor/unary_math.h"

#if DPAR_HAVE_ISA_CLONES
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")
#endif

// clang-format off
#include "tensor/cpu/bn_loops.h"
#include "tensor/cpu/elementwise_loops.h"
// clang-format on

namespace dpar::cpu::avx512 {

void batch_norm_forward_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             Tensor& mean, Tensor& var, bool use_batch_stats, double eps,
                             Activation act, Tensor& y, Tensor& z) {
  batch_norm_forward_typed<BF16>(x, weight, bias, mean, var, use_batch_stats, eps, act, y, z);
}

void batch_norm_backward_from_output_bf16(const Tensor& y, const Tensor& dz, const Tensor& weight,
                                          const Tensor& bias, const Tensor& var,
                                          bool use_batch_stats, double eps, Activation act,
                                          Tensor& dx, Tensor& dweight, Tensor& dbias) {
  bn_backward_from_output_typed<BF16>(y, dz, weight, bias, var, use_batch_stats, eps, act, dx,
                                      dweight, dbias);
}

void binary_bf16(kernels::BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  switch (op) {
    case BinaryOp::add:
      return binary_typed<BinaryOp::add, BF16>(a, b, out);
    case BinaryOp::sub:
      return binary_typed<BinaryOp::sub, BF16>(a, b, out);
    case BinaryOp::mul:
      return binary_typed<BinaryOp::mul, BF16>(a, b, out);
    case BinaryOp::div:
      return binary_typed<BinaryOp::div, BF16>(a, b, out);
  }
}

void affine_bf16(const Tensor& a, float alpha, float beta, Tensor& out) {
  affine_typed<BF16>(a, alpha, beta, out);
}

void add_inplace_bf16(Tensor& self, const Tensor& other, float alpha) {
  add_inplace_typed<BF16>(self, other, alpha);
}

void convert_f32_to_bf16(const float* from, uint16_t* to, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) to[i] = float_to_bf16(from[i]);
}

void convert_bf16_to_f32(const uint16_t* from, float* to, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) to[i] = bf16_to_float(from[i]);
}

}  // namespace dpar::cpu::avx512

#if DPAR_HAVE_ISA_CLONES
#pragma GCC pop_options
#endif
