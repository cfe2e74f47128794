#pragma once
// DataLoader: batches of examples prepared by background worker threads.
//
//   DataLoader loader(dataset, sampler, {.batch_size = 32, .num_workers = 2, .seed = 1});
//   for (int64_t e = 0; e < epochs; ++e)
//     for (Batch& b : loader.epoch(e)) train_step(b.images, b.labels);
//
// Each sample's transform gets its own Generator seeded from (seed, epoch, dataset index), so
// batches are bitwise identical whatever num_workers is and however the threads are
// scheduled; batches come out in sampler order. At most prefetch_batches batches (at least
// one per worker) are prepared ahead of the consumer. An exception while preparing a sample
// is re-thrown in the consumer as a dpar::Error naming the sample index. Destroying the loader
// (or starting another epoch) mid-epoch stops and joins the workers.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "dpar/data/dataset.h"
#include "dpar/data/sampler.h"

namespace dpar::data {

struct Batch {
  Tensor images;                // f32 [B,C,H,W], contiguous (C from the transform: 3 or 1)
  Tensor labels;                // i64 [B]
  std::vector<size_t> indices;  // dataset indices of the B examples
  size_t size() const { return indices.size(); }
};

struct DataLoaderOptions {
  size_t batch_size = 32;
  int num_workers = 0;          // 0: batches are prepared in the consumer's thread
  size_t prefetch_batches = 2;  // batches prepared ahead of the consumer, across all workers
  bool drop_last = false;       // drop a final batch smaller than batch_size
  uint64_t seed = 0;            // seeds every sample's transform Generator (with epoch, index)
  // Batches are built in pinned (page-locked) host memory, so `images.to(gpu, true)` copies
  // asynchronously on the GPU's copy stream, as PyTorch's pin_memory=True. Needs a usable
  // CUDA device: the constructor throws dpar::Error saying why otherwise.
  bool pin_memory = false;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
             DataLoaderOptions options = {});
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
             size_t batch_size, int num_workers = 0, size_t prefetch_batches = 2,
             bool drop_last = false, uint64_t seed = 0);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  size_t num_batches() const;  // per epoch
  size_t num_samples() const;  // per epoch: the sampler's indices less a dropped last batch
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

  // Explicit API: start_epoch(e), then next() until it returns nullopt. Starting an epoch
  // abandons the one in progress.
  void start_epoch(int64_t epoch);
  std::optional<Batch> next();

  // The Generator a sample's transform receives (exposed so tests and tools can reproduce one).
  static uint64_t sample_seed(uint64_t seed, int64_t epoch, size_t index);

  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    explicit Iterator(DataLoader* loader) : loader_(loader) { ++*this; }
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      return *this;
    }
    bool operator==(std::default_sentinel_t) const { return !current_.has_value(); }

   private:
    DataLoader* loader_;
    std::optional<Batch> current_;
  };
  class EpochRange {
   public:
    EpochRange(DataLoader* loader, int64_t epoch) : loader_(loader), epoch_(epoch) {}
    Iterator begin() {
      loader_->start_epoch(epoch_);
      return Iterator(loader_);
    }
    std::default_sentinel_t end() const { return {}; }

   private:
    DataLoader* loader_;
    int64_t epoch_;
  };
  // for (Batch& b : loader.epoch(e)) ...
  EpochRange epoch(int64_t e) { return EpochRange(this, e); }

 private:
  struct EpochState;
  void stop_epoch();
  Batch build_batch(const EpochState& st, size_t batch_index) const;

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Sampler> sampler_;
  DataLoaderOptions options_;
  std::unique_ptr<EpochState> state_;
};

}  // namespace dpar::data
