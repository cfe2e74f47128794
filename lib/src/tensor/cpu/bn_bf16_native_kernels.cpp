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

#if DPAR_HAVE_ISA_CLONES
constexpr int kDenormal = 0x20;  // vfpclassps: the class of f32 denormals

// The lanes of v rounded to bf16 as float_to_bf16 rounds them: by the instruction, and lane by
// lane where one holds a denormal (rare: the instruction would flush it).
inline __m256i round_vector(__m512 v, __mmask16 lanes) {
  __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  if (const __mmask16 denormal = _mm512_mask_fpclass_ps_mask(lanes, v, kDenormal); denormal != 0) {
    alignas(64) float f[16];
    alignas(32) uint16_t b[16];
    _mm512_store_ps(f, v);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), r);
    for (int j = 0; j < 16; ++j) {
      if ((denormal >> j) & 1) b[j] = float_to_bf16(f[j]);
    }
    r = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
  }
  return r;
}

// bf16 lanes widened to f32 (exact). The zero-masked forms: GCC 12 reports the unmasked ones'
// _mm512_undefined operand as uninitialised.
inline __m512 widen(__m256i bf16) {
  constexpr __mmask16 all = 0xffff;
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, bf16), 16));
}

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
}

// The activation of 16 lanes by unary_value's formulas, operation for operation, so the bits
// are the scalar loops': relu is x < 0 ? 0 : x, hardswish x * min(max(x + 3, 0), 6) / 6 with a
// NaN kept (ordered compares are false on it).
template <Activation Act>
inline __m512 activation_vector(__m512 x) {
  if constexpr (Act == Activation::relu) {
    const __m512 zero = _mm512_setzero_ps();
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), zero);
  } else if constexpr (Act == Activation::hardswish) {
    const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.f);
    __m512 m = _mm512_add_ps(x, _mm512_set1_ps(3.f));
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, zero, _CMP_LT_OQ), zero);
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(six, m, _CMP_LT_OQ), six);
    return _mm512_div_ps(_mm512_mul_ps(x, m), six);
  } else {
    return x;
  }
}
#endif

// n f32 values rounded to bf16, 16 at a time.
void round_run(const float* from, uint16_t* to, int64_t n) {
#if DPAR_HAVE_ISA_CLONES
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(lanes, from + i);
    _mm256_mask_storeu_epi16(to + i, lanes, round_vector(v, lanes));
  }
#else
  for (int64_t i = 0; i < n; ++i) to[i] = float_to_bf16(from[i]);
#endif
}

struct ConversionInstructionStore {
  static void store(const float* from, BF16* to, int64_t n) {
    round_run(from, reinterpret_cast<uint16_t*>(to), n);
  }

#if DPAR_HAVE_ISA_CLONES
  // normalize_run's work (bn_loops.h) in one pass with the values in registers: y = x * scale +
  // shift rounded to bf16 (into y where KeepY), z = act(y) from y's bf16 value. The generic
  // run wrote y to an f32 buffer, rounded it into y, read y back for the activation and
  // rounded again through the buffer: four passes that made the bf16 forward slower than the
  // f32 one, which moves half again as many bytes. The same operations in the same order, so
  // the bits are the same. x * scale + shift is written as a product and a sum, as in the
  // generic loop, not as an explicit FMA: GCC fuses both into one FMA where it contracts
  // (-ffp-contract=fast at -O2 and above) and neither at the sanitizer builds' -O1, so the two
  // paths agree either way.
  template <Activation Act, bool KeepY, bool Rows>
  static void normalize(const BF16* x, BF16* y, BF16* z, int64_t n, const float* scale,
                        const float* shift) {
    const auto* xs = reinterpret_cast<const uint16_t*>(x);
    auto* ys = reinterpret_cast<uint16_t*>(KeepY ? y : z);
    auto* zs = reinterpret_cast<uint16_t*>(z);
    const __m512 scale_all = _mm512_set1_ps(scale[0]), shift_all = _mm512_set1_ps(shift[0]);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 lanes = first_lanes(n - i);
      const __m512 xv = widen(_mm256_maskz_loadu_epi16(lanes, xs + i));
      const __m512 s = Rows ? _mm512_maskz_loadu_ps(lanes, scale + i) : scale_all;
      const __m512 b = Rows ? _mm512_maskz_loadu_ps(lanes, shift + i) : shift_all;
      const __m256i yb = round_vector(_mm512_add_ps(_mm512_mul_ps(xv, s), b), lanes);
      if constexpr (KeepY || Act == Activation::none) _mm256_mask_storeu_epi16(ys + i, lanes, yb);
      if constexpr (Act != Activation::none) {
        const __m256i zb = round_vector(activation_vector<Act>(widen(yb)), lanes);
        _mm256_mask_storeu_epi16(zs + i, lanes, zb);
      }
    }
  }
#endif
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
