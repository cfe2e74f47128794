// Device selection without a GPU (the CI machines): asking for a CUDA device gives one error
// line that says why, and Module::to keeps the handles it was given. The CUDA backend
// (libdpar_cuda) stays out of a process until a CUDA device is used.
#include <catch2/catch.hpp>
#include <fstream>

#include "core/cuda_backend.h"
#include "dpar/dpar.h"
#include "dpar/optim/sgd.h"
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

namespace {
// The lines of /proc/self/maps naming a CUDA library or dpar's CUDA backend.
std::vector<std::string> mapped_cuda_libraries() {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> found;
  std::string line;
  while (std::getline(maps, line)) {
    for (const char* lib : {"libdpar_cuda", "libcudart", "libcublas", "libcudnn", "libnccl"}) {
      if (line.find(lib) != std::string::npos) found.push_back(line);
    }
  }
  return found;
}
}  // namespace

// Each Catch test case runs in a process of its own under ctest, so this one sees a process
// that has done CPU work only.
TEST_CASE("CPU training in a CUDA build leaves the CUDA backend and its libraries unloaded") {
  manual_seed(0);
  nn::Linear layer(8, 4);
  optim::SGD opt(layer.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  const Tensor x = Tensor::ones({16, 8});
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    sum(relu(layer.forward(x))).backward();
    opt.step();
  }
  (void)cuda_device_summary(Device::cpu());
  synchronize(Device::cpu());
  check_device_available(Device::cpu());
  CHECK_FALSE(detail::cuda_backend_loaded());
  CHECK(mapped_cuda_libraries().empty());
}

TEST_CASE("the CUDA backend loads at the first CUDA query, or the reason says why it cannot") {
  REQUIRE_FALSE(detail::cuda_backend_loaded());
  const int count = cuda_device_count();
  if (!built_with_cuda()) {
    CHECK(count == 0);
    CHECK(cuda_unavailable_reason() == "dpar was built without CUDA");
    CHECK_FALSE(detail::cuda_backend_loaded());
    return;
  }
  if (detail::cuda_backend() == nullptr) {
    // A CUDA build whose backend cannot load here (no CUDA libraries): the reason is the load's.
    CHECK(count == 0);
    CHECK_THAT(cuda_unavailable_reason(), Catch::StartsWith("the CUDA backend cannot be loaded"));
    return;
  }
  CHECK(detail::cuda_backend_loaded());
  CHECK_FALSE(mapped_cuda_libraries().empty());
  if (count == 0) CHECK_FALSE(cuda_unavailable_reason().empty());
}
