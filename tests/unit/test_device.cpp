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

TEST_CASE("pinned memory without a GPU is refused with the reason") {
  if (cuda_device_count() > 0) {
    SUCCEED("a GPU is here: tests/gpu/test_cuda_pinned.cpp covers pinned memory");
    return;
  }
  const std::string msg = error_of([] { (void)Tensor::empty_pinned({4}); });
  CHECK_THAT(msg, Catch::StartsWith("pin_memory: pinned host memory needs "));
  CHECK_THAT(msg, Catch::Contains(built_with_cuda() ? cuda_unavailable_reason()
                                                    : "dpar was built without CUDA"));
  CHECK_THAT(error_of([] { (void)Tensor::ones({2}).pin_memory(); }),
             Catch::StartsWith("pin_memory: "));
  // A plain CPU tensor is not pinned, and a non-blocking move to the CPU is the identity.
  const Tensor t = Tensor::ones({3});
  CHECK_FALSE(t.is_pinned());
  CHECK(t.to(Device::cpu(), /*non_blocking=*/true).is_same(t));

  struct Three : data::Dataset {
    size_t size() const override { return 3; }
    data::Example get(size_t, Generator&) const override { return {Tensor::zeros({1, 2, 2}), 0}; }
    std::vector<std::string> class_names() const override { return {"a"}; }
  };
  auto dataset = std::make_shared<Three>();
  auto sampler = std::make_shared<data::SequentialSampler>(3);
  CHECK_THAT(error_of([&] {
               data::DataLoader loader(dataset, sampler, {.batch_size = 2, .pin_memory = true});
             }),
             Catch::StartsWith("DataLoader: pin_memory: pin_memory: pinned host memory needs "));
}
