// The layer set of a model of one's own (issue 19) on CUDA against the CPU backend: the
// activations, pointwise maths and the rest, forward and backward, to 1e-4 relative (f32).
#include "gpu/gpu_helpers.h"

using namespace dpar;

TEST_CASE("activations and pointwise maths match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor wide = random_tensor({4, 3, 5}, 5, -5, 5);
  const Tensor positive = random_tensor({4, 3, 5}, 6, 0.5f, 3.f);
  compare_op("tanh", [](auto& t) { return dpar::tanh(t[0]); }, {wide});
  compare_op("gelu", [](auto& t) { return gelu(t[0]); }, {wide});
  compare_op("gelu tanh", [](auto& t) { return gelu(t[0], GeluApproximation::tanh); }, {wide});
  compare_op("silu", [](auto& t) { return silu(t[0]); }, {wide});
  compare_op("softplus", [](auto& t) { return softplus(t[0], 2.0, 3.0); }, {wide});
  compare_op("leaky_relu", [](auto& t) { return leaky_relu(t[0], 0.2); }, {wide});
  compare_op("abs", [](auto& t) { return dpar::abs(t[0]); }, {wide});
  compare_op("clamp", [](auto& t) { return clamp(t[0], -1.0, 2.0); }, {wide});
  compare_op("pow", [](auto& t) { return dpar::pow(t[0], 1.5); }, {positive});
  compare_op("gelu on a transposed view", [](auto& t) { return gelu(t[0].transpose(0, 2)); },
             {wide});
}
