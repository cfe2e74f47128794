#include "dpar/torch/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include "dpar/core/error.h"
#include "dpar/distributed/parallel_env.h"

namespace dpar::torch {

DistributedSampler::DistributedSampler(size_t dataset_size, DistributedSamplerOptions options)
    : state_(std::make_shared<State>()) {
  if (options.world_size < 0) {
    dist::require_init_under_launcher("dpar::torch::DistributedSampler");
    options.world_size = dist::get_world_size();
  }
  if (options.rank < 0) options.rank = dist::get_rank();
  DPAR_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size,
             "dpar::torch::DistributedSampler: rank ", options.rank, " is not in a world of size ",
             options.world_size);
  state_->size = dataset_size;
  state_->options = options;
  draw();
}

void DistributedSampler::set_epoch(int64_t epoch) {
  DPAR_CHECK(epoch >= 0, "dpar::torch::DistributedSampler::set_epoch: epoch must be >= 0, got ",
             epoch);
  state_->epoch = epoch;
  state_->position = 0;
  state_->keep_position = false;
  draw();
}

void DistributedSampler::set_position(size_t consumed) {
  DPAR_CHECK(consumed <= state_->indices.size(),
             "dpar::torch::DistributedSampler::set_position: ", consumed,
             " samples consumed, but this rank reads ", state_->indices.size(), " per epoch");
  state_->position = consumed;
  state_->keep_position = true;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  State& s = *state_;
  // The order depends on size and epoch only, and set_epoch() drew it already: a loader's
  // begin() redraws only for a new size.
  const bool resized = new_size && *new_size != s.size;
  if (resized) {
    s.size = *new_size;
    s.keep_position = false;
  }
  if (!s.keep_position) s.position = 0;
  s.keep_position = false;
  if (resized) draw();
}

void DistributedSampler::draw() {
  State& s = *state_;
  const size_t world = static_cast<size_t>(s.options.world_size);
  // As torch.utils.data.DistributedSampler.
  size_t per_rank = (s.size + world - 1) / world;
  if (s.options.drop_last && s.size % world != 0)
    per_rank = s.size < world ? 0 : (s.size - 1) / world;
  const size_t total = per_rank * world;
  std::vector<size_t> order(s.size);
  if (s.options.shuffle) {
    auto gen =
        at::make_generator<at::CPUGeneratorImpl>(s.options.seed + static_cast<uint64_t>(s.epoch));
    const at::Tensor perm = at::randperm(static_cast<int64_t>(s.size), gen, at::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < s.size; ++i) order[i] = static_cast<size_t>(p[i]);
  } else {
    for (size_t i = 0; i < s.size; ++i) order[i] = i;
  }
  if (order.size() < total && !order.empty()) {
    const size_t base = order.size();  // pad by repeating the order from its start
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i % base]);
  }
  order.resize(total);
  s.indices.clear();
  for (size_t i = static_cast<size_t>(s.options.rank); i < total; i += world) {
    s.indices.push_back(order[i]);
  }
  s.position = std::min(s.position, s.indices.size());
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  State& s = *state_;
  if (s.position >= s.indices.size()) return c10::nullopt;
  const size_t end = std::min(s.indices.size(), s.position + batch_size);
  std::vector<size_t> batch(s.indices.begin() + static_cast<std::ptrdiff_t>(s.position),
                            s.indices.begin() + static_cast<std::ptrdiff_t>(end));
  s.position = end;
  return batch;
}

void DistributedSampler::save(::torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", at::tensor(state_->epoch, at::kLong), /*is_buffer=*/true);
  archive.write("position", at::tensor(static_cast<int64_t>(state_->position), at::kLong),
                /*is_buffer=*/true);
}

void DistributedSampler::load(::torch::serialize::InputArchive& archive) {
  at::Tensor epoch = at::empty({}, at::kLong), position = at::empty({}, at::kLong);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  set_epoch(epoch.item<int64_t>());
  set_position(static_cast<size_t>(position.item<int64_t>()));
}

}  // namespace dpar::torch
