// bn_loops.h's f32 loops for AVX2 + FMA (bn_isa.h).
#define DPAR_BN_ISA avx2
#define DPAR_BN_ISA_TARGET _Pragma("GCC target(\"avx2,fma\")")
#include "tensor/cpu/bn_isa_kernels.inc"
