// Samplers: sequential, shuffled, and per-rank shards.
#include "dpar/data/sampler.h"

#include <algorithm>
#include <numeric>

#include "dpar/core/error.h"
#include "dpar/core/random.h"
#include "dpar/distributed/parallel_env.h"

namespace dpar::data {

std::vector<size_t> random_permutation(size_t n, uint64_t seed) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t{0});
  Generator gen(seed);
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(gen.next_u64() % i);
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

std::vector<size_t> SequentialSampler::indices(int64_t) const {
  std::vector<size_t> out(n_);
  std::iota(out.begin(), out.end(), size_t{0});
  return out;
}

std::vector<size_t> RandomSampler::indices(int64_t epoch) const {
  return random_permutation(n_, seed_ + static_cast<uint64_t>(epoch));
}

DistributedSampler::DistributedSampler(size_t n, int64_t rank, int64_t world_size, bool shuffle,
                                       uint64_t seed)
    : n_(n), rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed) {
  DPAR_CHECK(world_size > 0, "DistributedSampler: world_size must be positive, got ", world_size);
  DPAR_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
             " out of range for world_size ", world_size);
  // rank 0 of 1 is what get_rank()/get_world_size() say before init_parallel_env().
  if (world_size == 1) dist::require_init_under_launcher("DistributedSampler");
}

SkipSampler::SkipSampler(std::shared_ptr<const Sampler> base, int64_t epoch, size_t start)
    : base_(std::move(base)), epoch_(epoch), start_(start) {
  DPAR_CHECK(base_ != nullptr, "SkipSampler: the base sampler is null");
  DPAR_CHECK(start_ <= base_->size(), "SkipSampler: cannot start at position ", start_, " of ",
             base_->size(), " indices");
}

size_t SkipSampler::size() const { return base_->size() - start_; }

std::vector<size_t> SkipSampler::indices(int64_t epoch) const {
  DPAR_CHECK(epoch == epoch_, "SkipSampler: built for epoch ", epoch_, ", asked for epoch ", epoch,
             " (it replays the rest of one interrupted epoch; use the base sampler for later "
             "epochs)");
  std::vector<size_t> all = base_->indices(epoch);
  return std::vector<size_t>(all.begin() + static_cast<std::ptrdiff_t>(start_), all.end());
}

size_t DistributedSampler::size() const {
  const size_t w = static_cast<size_t>(world_size_);
  return (n_ + w - 1) / w;
}

std::vector<size_t> DistributedSampler::epoch_order(int64_t epoch) const {
  std::vector<size_t> order;
  if (shuffle_) {
    order = random_permutation(n_, seed_ + static_cast<uint64_t>(epoch));
  } else {
    order.resize(n_);
    std::iota(order.begin(), order.end(), size_t{0});
  }
  return order;
}

EpochRemainderSampler::EpochRemainderSampler(std::shared_ptr<const DistributedSampler> base,
                                             int64_t epoch, size_t consumed)
    : base_(std::move(base)), epoch_(epoch), consumed_(consumed) {
  DPAR_CHECK(base_ != nullptr, "EpochRemainderSampler: the base sampler is null");
  // A job that padded its last steps consumed more positions than the epoch has.
  consumed_ = std::min(consumed_, base_->dataset_size());
}

size_t EpochRemainderSampler::size() const {
  const size_t rest = base_->dataset_size() - consumed_;
  const size_t w = static_cast<size_t>(base_->world_size());
  return (rest + w - 1) / w;
}

std::vector<size_t> EpochRemainderSampler::indices(int64_t epoch) const {
  DPAR_CHECK(epoch == epoch_, "EpochRemainderSampler: built for epoch ", epoch_,
             ", asked for epoch ", epoch, " (use the base sampler for later epochs)");
  const std::vector<size_t> order = base_->epoch_order(epoch);
  const size_t rest = order.size() - consumed_;
  const size_t w = static_cast<size_t>(base_->world_size());
  std::vector<size_t> out;
  for (size_t k = 0; k < size(); ++k) {
    const size_t pos = k * w + static_cast<size_t>(base_->rank());
    out.push_back(order[consumed_ + pos % rest]);
  }
  return out;
}

std::vector<size_t> DistributedSampler::indices(int64_t epoch) const {
  if (n_ == 0) return {};
  const std::vector<size_t> order = epoch_order(epoch);
  const size_t per_rank = size();
  const size_t w = static_cast<size_t>(world_size_);
  std::vector<size_t> out;
  out.reserve(per_rank);
  for (size_t k = 0; k < per_rank; ++k) {
    // Position in the padded order; padding repeats the order from its start.
    const size_t pos = k * w + static_cast<size_t>(rank_);
    out.push_back(order[pos % n_]);
  }
  return out;
}

}  // namespace dpar::data
