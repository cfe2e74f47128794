#pragma once
// DistributedSampler for torch::data datasets: each rank reads its own share of the dataset,
// as torch.utils.data.DistributedSampler does, with the same indices (rank r takes positions
// r, r + W, r + 2W, ... of the epoch's order).
//   * shuffle: the order is torch::randperm(size) from a generator seeded with seed + epoch,
//     so it changes every epoch (call set_epoch) and is the same on every rank and in
//     PyTorch's Python sampler with the same seed;
//   * drop_last = false pads the order with its first indices to a multiple of the world size
//     (every rank gets ceil(size / W) samples); true drops the tail (floor(size / W) each);
//   * set_position(k) resumes mid-epoch after the k samples this rank had already consumed
//     (io::TrainingState::sampler_position): the next reset() (a data loader's begin())
//     keeps that position once; save()/load() carry epoch and position too.
// Rank and world size default to dpar's default group (dpar::dist::init_parallel_env()).
//
// Copies share one state: torch::data::make_data_loader keeps its own copy of the sampler, and
// set_epoch() on yours reaches it, as the Python sampler's set_epoch reaches its loader's.
//
//   dpar::torch::DistributedSampler sampler(dataset.size().value());
//   auto loader = torch::data::make_data_loader(dataset.map(Stack<>()), sampler, batch);
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (auto& b : *loader) ...
#include <torch/data/samplers/base.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace dpar::torch {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int rank = -1;        // -1: dpar::dist::get_rank()
  int world_size = -1;  // -1: dpar::dist::get_world_size()
};

class DistributedSampler : public ::torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  explicit DistributedSampler(size_t dataset_size, DistributedSamplerOptions options = {});

  // The epoch whose order the next reset() draws (as the Python sampler's set_epoch).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return state_->epoch; }
  // Skips the first `consumed` samples of this rank's share in the current epoch.
  void set_position(size_t consumed);
  size_t position() const { return state_->position; }
  // Samples this rank reads per epoch.
  size_t num_samples() const { return state_->indices.size(); }
  // This rank's indices for the current epoch, in order.
  const std::vector<size_t>& indices() const { return state_->indices; }

  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(::torch::serialize::OutputArchive& archive) const override;
  void load(::torch::serialize::InputArchive& archive) override;

 private:
  struct State {
    size_t size = 0;
    DistributedSamplerOptions options;
    int64_t epoch = 0;
    size_t position = 0;
    bool keep_position = false;  // set_position() survives the next reset()
    std::vector<size_t> indices;
  };
  void draw();

  std::shared_ptr<State> state_;
};

}  // namespace dpar::torch
