// Half-precision activations on the GPU, in f16 and bf16: the checks of
// tests/half_precision_checks.h (each op against the same values in f32, forward and backward;
// the dtypes between ops under autocast; one MobileNetV3-small step against the f32 step), as
// tests/unit/test_cpu_bf16_ops runs them on the CPU in bf16.
#include "gpu/gpu_helpers.h"
#include "half_precision_checks.h"

using namespace dpar;

namespace {
const std::vector<DType> kHalfTypes = {DType::f16, DType::bf16};
}  // namespace

TEST_CASE("adds and products in f16/bf16 match f32: same shapes, strided, SE-gate broadcasts") {
  DPAR_REQUIRE_GPU();
  half_checks::check_adds_and_products(kGpu, kHalfTypes);
}

TEST_CASE("activations and dropout in f16/bf16 match f32") {
  DPAR_REQUIRE_GPU();
  half_checks::check_activations(kGpu, kHalfTypes);
}

TEST_CASE("BatchNorm with its activation on f16/bf16 data: f32 statistics and parameters") {
  DPAR_REQUIRE_GPU();
  half_checks::check_batch_norm(kGpu, kHalfTypes);
}

TEST_CASE("global average pooling in f16/bf16 matches f32 in both layouts") {
  DPAR_REQUIRE_GPU();
  half_checks::check_global_pooling(kGpu, kHalfTypes);
}

TEST_CASE("the dtypes between ops under autocast") {
  DPAR_REQUIRE_GPU();
  half_checks::check_dtypes_between_ops(kGpu, kHalfTypes);
}

TEST_CASE("mobilenet_v3_small: one training step under autocast is close to the f32 step") {
  DPAR_REQUIRE_GPU();
  half_checks::check_mobilenet_step(kGpu, kHalfTypes);
}
