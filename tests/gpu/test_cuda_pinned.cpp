// Pinned host memory and non-blocking copies: values arrive intact, pinned blocks are reused
// only after the copies that read them, and the data loader builds pinned batches.
#include "gpu/gpu_helpers.h"

using namespace dpar;

TEST_CASE("pinned tensors copy to the GPU asynchronously and intact") {
  DPAR_REQUIRE_GPU();
  Tensor pinned = Tensor::empty_pinned({64, 3, 8, 8});
  CHECK(pinned.is_pinned());
  CHECK(pinned.device().is_cpu());
  const Tensor values = random_tensor({64, 3, 8, 8}, 7);
  pinned.copy_(values);
  const Tensor on_gpu = pinned.to(kGpu, /*non_blocking=*/true);
  CHECK(on_gpu.device() == kGpu);
  CHECK(relative_error(values, on_gpu) == 0.0);
  // pin_memory copies a pageable tensor once; a pinned one is returned as it is.
  const Tensor repinned = values.pin_memory();
  CHECK(repinned.is_pinned());
  CHECK(repinned.pin_memory().is_same(repinned));
  CHECK(relative_error(values, repinned) == 0.0);
  // copy_ from a pinned tensor (the blocking path) is also intact.
  Tensor dst = Tensor::zeros({64, 3, 8, 8}, DType::f32, kGpu);
  dst.copy_(pinned);
  CHECK(relative_error(values, dst) == 0.0);
}

TEST_CASE("a reused pinned block never overwrites a copy still in flight") {
  DPAR_REQUIRE_GPU();
  // Each round fills a fresh pinned batch with its own value and moves it without waiting;
  // the batch dies at once, so the next round may get the same block back. The cache must
  // hand it out only after the previous copy read it.
  std::vector<Tensor> on_gpu;
  for (int round = 0; round < 50; ++round) {
    Tensor batch = Tensor::empty_pinned({256, 1024});
    batch.fill_(static_cast<double>(round));
    on_gpu.push_back(batch.to(kGpu, /*non_blocking=*/true));
  }
  synchronize(kGpu);
  for (int round = 0; round < 50; ++round) {
    const std::vector<float> v = on_gpu[static_cast<size_t>(round)].to_float_vector();
    CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x == static_cast<float>(round); }));
  }
}

TEST_CASE("the data loader builds pinned batches when asked") {
  DPAR_REQUIRE_GPU();
  struct Ramp : data::Dataset {
    size_t size() const override { return 10; }
    data::Example get(size_t i, Generator&) const override {
      return {Tensor::full({3, 4, 4}, static_cast<double>(i)), static_cast<int64_t>(i % 3)};
    }
    std::vector<std::string> class_names() const override { return {"a", "b", "c"}; }
  };
  data::DataLoader loader(std::make_shared<Ramp>(), std::make_shared<data::SequentialSampler>(10),
                          {.batch_size = 4, .num_workers = 2, .pin_memory = true});
  size_t seen = 0;
  for (data::Batch& b : loader.epoch(0)) {
    CHECK(b.images.is_pinned());
    CHECK(b.labels.is_pinned());
    const Tensor images = b.images.to(kGpu, true), labels = b.labels.to(kGpu, true);
    const std::vector<float> v = images.to_float_vector();
    const std::vector<int64_t> l = labels.to_int_vector();
    for (size_t k = 0; k < b.size(); ++k) {
      CHECK(v[k * 48] == static_cast<float>(b.indices[k]));
      CHECK(l[k] == static_cast<int64_t>(b.indices[k] % 3));
    }
    seen += b.size();
  }
  CHECK(seen == 10);
}
