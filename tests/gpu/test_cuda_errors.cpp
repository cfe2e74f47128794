// Device errors: a bad device index, an out-of-memory allocation and a kernel given the wrong
// device give one dpar::Error naming what and where.
#include "gpu/gpu_helpers.h"
#include "unit/helpers.h"

using namespace dpar;

TEST_CASE("a CUDA device index this process does not have is one clear error") {
  DPAR_REQUIRE_GPU();
  const int count = cuda_device_count();
  const std::string msg = error_of([&] { check_device_available(Device::cuda(count)); });
  CHECK_THAT(msg, Catch::Contains("cuda:" + std::to_string(count) + " is not available"));
  CHECK_THAT(msg, Catch::Contains("sees " + std::to_string(count) + " CUDA device"));
  nn::Linear layer(4, 2);
  CHECK_THAT(error_of([&] { layer.to(Device::cuda(count)); }), Catch::Contains("is not available"));
}

TEST_CASE("an allocation larger than the GPU names the op, the bytes and what dpar holds") {
  DPAR_REQUIRE_GPU();
  Tensor small = Tensor::ones({1024}, DType::f32, kGpu);
  const std::string msg =
      error_of([&] { Tensor huge = Tensor::empty({int64_t{1} << 40}, DType::f32, kGpu); });
  CHECK_THAT(msg, Catch::Contains("CUDA out of memory"));
  CHECK_THAT(msg, Catch::Contains("tried to allocate 4194304 MiB on cuda:0"));
  CHECK_THAT(msg, Catch::Contains("dpar holds"));
  // The process goes on: the failed allocation left nothing behind.
  CHECK(sum(small).item() == 1024.0);
}

TEST_CASE("tensors on different devices are refused by the op, naming both") {
  DPAR_REQUIRE_GPU();
  Tensor a = Tensor::ones({2, 3}, DType::f32, kGpu), b = Tensor::ones({2, 3});
  const std::string msg = error_of([&] { add(a, b); });
  CHECK_THAT(msg, Catch::Contains("cuda:0"));
  CHECK_THAT(msg, Catch::Contains("cpu"));
}

TEST_CASE("synchronize and the device summary work on the GPU") {
  DPAR_REQUIRE_GPU();
  Tensor a = Tensor::full({1000}, 2.0, DType::f32, kGpu);
  synchronize(kGpu);
  CHECK_THAT(cuda_device_summary(kGpu), Catch::Contains("CUDA runtime"));
  CHECK(sum(a).item() == 2000.0);
}
