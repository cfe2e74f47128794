#include "tensor/cpu/isa.h"

#include <cstdlib>
#include <string>

namespace dpar::cpu {

Isa cpu_isa() {
  static const Isa isa = [] {
    Isa best = Isa::baseline;
#if DPAR_HAVE_ISA_CLONES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::avx2;
    if (best == Isa::avx2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
      best = Isa::avx512;
    }
#endif
    const char* cap = std::getenv("DPAR_CPU_ISA");
    if (cap != nullptr && std::string(cap) == "baseline") return Isa::baseline;
    if (cap != nullptr && std::string(cap) == "avx2" && best == Isa::avx512) return Isa::avx2;
    return best;
  }();
  return isa;
}

bool cpu_has_avx512_bf16() {
  static const bool has = [] {
    if (cpu_isa() != Isa::avx512) return false;
    const char* cap = std::getenv("DPAR_CPU_ISA");
    if (cap != nullptr && std::string(cap) == "avx512") return false;
#if DPAR_HAVE_ISA_CLONES
    return __builtin_cpu_supports("avx512bf16") != 0;
#else
    return false;
#endif
  }();
  return has;
}

}  // namespace dpar::cpu
