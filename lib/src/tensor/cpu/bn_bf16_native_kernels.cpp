// bn_loops.h's bf16 loops for CPUs with AVX512-BF16: the loops of avx512_bf16_kernels.cpp, but
// each bf16 result is rounded by the CPU's conversion instruction (vcvtneps2bf16) over a run of
// f32 values (bn_loops.h's Store), where those loops round each element with integer
// arithmetic. The vectoriser never emits the instruction, and the inline rounding (~10
// instructions a vector, twice per element in the forward) was about a third of the bf16 batch
// norm's time in MobileNetV3-small's step.
// The instruction rounds to nearest even and quietens a NaN as float_to_bf16 does, but it
// flushes an f32 denormal to zero; a vector holding one is rounded by float_to_bf16, so the bits
// are float_to_bf16's everywhere, the same as the AVX-512 loops'.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cpu/avx512_bf16.h"
#include "tensor/cpu/float_types.h"
#include "tensor/cpu/isa.h"
#include "tensor/nn_kernels.h"
#include "tensor/unary_math.h"

#if DPAR_HAVE_ISA_CLONES
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma")
#endif

// clang-format off
#include "tensor/cpu/bn_loops.h"
// clang-format on

namespace dpar::cpu::bf16_native {
namespace {

// n f32 values rounded to bf16, 16 at a time.
void round_run(const float* from, uint16_t* to, int64_t n) {
#if DPAR_HAVE_ISA_CLONES
  constexpr int kDenormal = 0x20;  // vfpclassps: the class of f32 denormals
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes =
        n - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(lanes, from + i);
    if (_mm512_mask_fpclass_ps_mask(lanes, v, kDenormal) != 0) {
      for (int64_t j = i; j < std::min(n, i + 16); ++j) to[j] = float_to_bf16(from[j]);
      continue;
    }
    _mm256_mask_storeu_epi16(to + i, lanes, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
#else
  for (int64_t i = 0; i < n; ++i) to[i] = float_to_bf16(from[i]);
#endif
}

struct ConversionInstructionStore {
  static void store(const float* from, BF16* to, int64_t n) {
    round_run(from, reinterpret_cast<uint16_t*>(to), n);
  }
};

}  // namespace

// Split evenly over the threads, in whole vectors, from 65536 values (as the AVX-512 cast).
void convert_f32_to_bf16(const float* from, uint16_t* to, int64_t n) {
  const int64_t threads = n > 65536 ? omp_get_max_threads() : 1;
  const int64_t piece = ((n + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for schedule(static) if (threads > 1)
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = std::min(n, t * piece);
    round_run(from + begin, to + begin, std::min(piece, n - begin));
  }
}

void batch_norm_forward_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             Tensor& mean, Tensor& var, bool use_batch_stats, double eps,
                             Activation act, Tensor& y, Tensor& z) {
  batch_norm_forward_typed<BF16, ConversionInstructionStore>(x, weight, bias, mean, var,
                                                             use_batch_stats, eps, act, y, z);
}

void batch_norm_backward_from_output_bf16(const Tensor& y, const Tensor& dz, const Tensor& weight,
                                          const Tensor& bias, const Tensor& var,
                                          bool use_batch_stats, double eps, Activation act,
                                          Tensor& dx, Tensor& dweight, Tensor& dbias) {
  bn_backward_from_output_typed<BF16, ConversionInstructionStore>(
      y, dz, weight, bias, var, use_batch_stats, eps, act, dx, dweight, dbias);
}

}  // namespace dpar::cpu::bf16_native

#if DPAR_HAVE_ISA_CLONES
#pragma GCC pop_options
#endif
