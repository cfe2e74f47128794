#include "dpar/tensor/autocast.h"

#include <cstdlib>
#include <string>

#include "dpar/core/error.h"
#include "tensor/autocast_policy.h"
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

}  // namespace dpar::amp

namespace dpar::detail {

DType autocast_compute_dtype(Device device) {
  return device.is_cuda() ? amp::autocast_dtype() : DType::f32;
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
