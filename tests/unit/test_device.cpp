// Device selection without a GPU (the CI machines): asking for a CUDA device gives one error
// line that says why, and Module::to keeps the handles it was given.
#include <catch2/catch.hpp>

#include "dpar/dpar.h"
#include "unit/helpers.h"

using namespace dpar;

TEST_CASE("check_device_available says why a CUDA device cannot be used") {
  CHECK_NOTHROW(check_device_available(Device::cpu()));
  const int count = cuda_device_count();
  if (count > 0) {
    CHECK_NOTHROW(check_device_available(Device::cuda(0)));
    CHECK(cuda_unavailable_reason().empty());
  } else {
    const std::string msg = error_of([] { check_device_available(Device::cuda(0)); });
    CHECK_THAT(msg, Catch::Contains("device cuda:0 is not available: "));
    CHECK_THAT(msg, Catch::Contains(built_with_cuda() ? "CUDA" : "dpar was built without CUDA"));
    CHECK(msg.find(cuda_unavailable_reason()) != std::string::npos);
  }
  CHECK_THAT(error_of([&] { check_device_available(Device::cuda(count + 3)); }),
             Catch::Contains("cuda:" + std::to_string(count + 3) + " is not available"));
}

TEST_CASE("Module::to the CPU keeps the handles, to a missing GPU is refused") {
  nn::Linear layer(3, 2);
  const Tensor handle = layer.weight;
  const std::vector<float> before = handle.to_float_vector();
  layer.to(Device::cpu());
  CHECK(layer.weight.is_same(handle));
  CHECK(handle.to_float_vector() == before);
  if (cuda_device_count() == 0) {
    CHECK_THAT(error_of([&] { layer.to(Device::cuda(0)); }), Catch::Contains("is not available"));
    CHECK(handle.device().is_cpu());
  }
}

TEST_CASE("synchronize on the CPU is a no-op") { CHECK_NOTHROW(synchronize(Device::cpu())); }
