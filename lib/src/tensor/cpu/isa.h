#pragma once
// Wider vectors for the hottest pointwise loops. The library is built for the x86-64 baseline
// (SSE2) so it runs anywhere; a loop compiled a second time with DPAR_TARGET_AVX512 (or
// DPAR_TARGET_AVX2) runs 16 (8) floats per instruction where the CPU has them, chosen once at
// run time. Only loop bodies made of always-inline code (tensor/unary_math.h) are cloned this
// way, so no out-of-line function is ever compiled for an ISA the CPU may lack.
#if defined(__x86_64__) && !defined(__clang__)
#define DPAR_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))
#define DPAR_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define DPAR_HAVE_ISA_CLONES 1
#else
#define DPAR_TARGET_AVX512
#define DPAR_TARGET_AVX2
#define DPAR_HAVE_ISA_CLONES 0
#endif

namespace dpar::cpu {

enum class Isa { baseline, avx2, avx512 };

// The widest of the above this CPU runs (DPAR_CPU_ISA=baseline|avx2 caps it, for comparisons).
Isa cpu_isa();

// Whether cpu_isa() is avx512 and the CPU also has AVX512-BF16's instructions (the f32 -> bf16
// conversion); DPAR_CPU_ISA=avx512 leaves them out (and leaves cpu_isa() as it is), as do the
// caps above.
bool cpu_has_avx512_bf16();

}  // namespace dpar::cpu
