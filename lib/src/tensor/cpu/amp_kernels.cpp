// CPU kernel of the loss scaler: unscale a gradient and detect inf/nan in the same pass, so a
// step reads each gradient once instead of once to check and once to divide.
#include "optim/amp_kernels.h"

#include <bit>
#include <cstdint>

namespace dpar::cpu {
namespace {

// Below this many elements the thread start-up costs more than the pass itself (as for the
// optimizer updates).
constexpr int64_t kParallelThreshold = 32768;
// An f32 is inf or nan exactly when all its exponent bits are set. Testing the bits (an
// integer OR-reduction) lets GCC vectorise the loop; std::isfinite would make it branch.
constexpr uint32_t kExponentBits = 0x7f800000u;

void unscale_and_check_finite_cpu(Tensor& grad, float inv_scale, Tensor& found_inf) {
  DPAR_CHECK(grad.dtype() == DType::f32 && grad.is_dense(),
             "unscale_and_check_finite needs a dense f32 gradient, got ", grad.str(), " strides ",
             grad.strides());
  DPAR_CHECK(found_inf.dtype() == DType::f32 && found_inf.numel() == 1 &&
                 found_inf.device() == grad.device(),
             "unscale_and_check_finite: found_inf must be a one-element f32 tensor on ",
             grad.device(), ", got ", found_inf.str());
  const int64_t n = grad.numel();
  float* g = static_cast<float*>(grad.raw_data());
  uint32_t bad = 0;
  // The result is checked rather than the input: it is what the optimizer will read, and it
  // also catches a finite gradient that overflows when the scale is below 1.
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const float y = g[i] * inv_scale;
    g[i] = y;
    bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(y) & kExponentBits) == kExponentBits);
  }
  if (bad) *static_cast<float*>(found_inf.raw_data()) = 1.0f;
}

}  // namespace

void register_amp_kernels() {
  kernels::unscale_and_check_finite.set(DeviceType::CPU, unscale_and_check_finite_cpu);
}

}  // namespace dpar::cpu
