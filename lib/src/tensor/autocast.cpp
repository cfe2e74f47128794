#include "dpar/tensor/autocast.h"

#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "dpar/core/error.h"
#include "dpar/core/sysinfo.h"
#include "tensor/autocast_policy.h"
#include "tensor/cpu/onednn_context.h"
#include "tensor/nn_kernels.h"

namespace dpar::amp {
namespace {
thread_local DType current = DType::f32;
}  // namespace

Autocast::Autocast(DType dtype, bool enabled) : previous_(current) {
  DPAR_CHECK(dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::f32,
             "amp::Autocast: expected f16, bf16 or f32, got ", dtype_name(dtype));
  if (enabled) current = dtype;
}

Autocast::~Autocast() { current = previous_; }

DType autocast_dtype() { return current; }

CpuBf16 cpu_bf16_support() {
  static const CpuBf16 support = [] {
    // oneDNN's own dispatch decides which kernels run, so its view of the CPU is the one asked.
    using cpu::onednn::isa_covers;
    if (isa_covers(dnnl::cpu_isa::avx512_core_bf16)) return CpuBf16::native;
    if (isa_covers(dnnl::cpu_isa::avx512_core)) return CpuBf16::emulated;
    return CpuBf16::unsupported;
  }();
  return support;
}

}  // namespace dpar::amp

namespace dpar::detail {

DType autocast_compute_dtype(Device device) {
  const DType dtype = amp::autocast_dtype();
  if (device.is_cuda() || dtype == DType::f32) return dtype;
  // The CPU computes in bf16 only (as torch.autocast(device_type="cpu") did before fp16 was
  // added to it): f16 leaves CPU ops in f32.
  if (dtype != DType::bf16) return DType::f32;
  DPAR_CHECK(amp::cpu_bf16_support() != amp::CpuBf16::unsupported,
             "amp::Autocast(bf16): CPU ops in bf16 need AVX-512 (oneDNN's bf16 kernels), which "
             "oneDNN does not find on this CPU (",
             sysinfo::cpu_model(), "); leave the CPU part of the program out of autocast");
  return DType::bf16;
}

bool autocast_half_outputs() {
  static const bool half = [] {
    const char* v = std::getenv("DPAR_AMP_ACTIVATIONS");
    if (v == nullptr || *v == 0) return true;
    const std::string text(v);
    DPAR_CHECK(text == "half" || text == "f32", "DPAR_AMP_ACTIVATIONS: expected half or f32, got '",
               text, "'");
    return text == "half";
  }();
  return half;
}

}  // namespace dpar::detail
