// bn_loops.h's f32 loops for AVX-512 (bn_isa.h).
#define DPAR_BN_ISA avx512
#define DPAR_BN_ISA_TARGET _Pragma("GCC target(\"avx512f,avx512dq,avx512bw,avx512vl,avx2,fma\")")
#include "tensor/cpu/bn_isa_kernels.inc"
