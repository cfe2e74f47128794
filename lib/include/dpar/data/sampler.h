#pragma once
// Samplers decide which dataset indices an epoch visits, in which order. indices(epoch) is a
// pure function of the sampler's configuration and the epoch, so every process and every
// restart sees the same order.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace dpar::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual size_t size() const = 0;  // number of indices per epoch
  virtual std::vector<size_t> indices(int64_t epoch) const = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  std::vector<size_t> indices(int64_t epoch) const override;

 private:
  size_t n_;
};

// A fresh permutation of 0..n-1 each epoch, drawn from seed + epoch.
class RandomSampler : public Sampler {
 public:
  RandomSampler(size_t n, uint64_t seed) : n_(n), seed_(seed) {}
  size_t size() const override { return n_; }
  std::vector<size_t> indices(int64_t epoch) const override;

 private:
  size_t n_;
  uint64_t seed_;
};

// One rank's shard for data-parallel training (as torch's DistributedSampler): the epoch's
// order (a permutation from seed + epoch, identical on every rank, or 0..n-1 without shuffle)
// is padded by wrapping around to a multiple of world_size, and rank takes every
// world_size-th index starting at its rank. Shards are disjoint apart from the padding and
// all have ceil(n / world_size) indices, so every rank runs the same number of steps.
// A process that a launcher started as one rank of several (its environment says so) must
// call dist::init_parallel_env() before passing dist::get_rank()/get_world_size() here: the
// constructor throws, naming the variable, when it gets rank 0 of 1 in that situation.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(size_t n, int64_t rank, int64_t world_size, bool shuffle = true,
                     uint64_t seed = 0);
  size_t size() const override;
  std::vector<size_t> indices(int64_t epoch) const override;
  // The epoch's whole order, before it is split over the ranks.
  std::vector<size_t> epoch_order(int64_t epoch) const;
  size_t dataset_size() const { return n_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }

 private:
  size_t n_;
  int64_t rank_;
  int64_t world_size_;
  bool shuffle_;
  uint64_t seed_;
};

// The rest of an epoch that a job of another world size began: base's epoch order from
// position `consumed` on (the samples that job's ranks had taken together: steps x batch x
// its world size), split over base's ranks as DistributedSampler splits (padded by wrapping
// within the rest, rank takes every world_size-th). A resume with another number of ranks
// thereby continues at the same sample of the same order. Built for one epoch.
class EpochRemainderSampler : public Sampler {
 public:
  EpochRemainderSampler(std::shared_ptr<const DistributedSampler> base, int64_t epoch,
                        size_t consumed);
  size_t size() const override;
  std::vector<size_t> indices(int64_t epoch) const override;

 private:
  std::shared_ptr<const DistributedSampler> base_;
  int64_t epoch_;
  size_t consumed_;
};

// Exact mid-epoch resume: base's order for `epoch` from position `start` on, i.e. the
// batches of an interrupted epoch that were not trained yet. The DataLoader seeds each
// sample's augmentation from (seed, epoch, dataset index), never from the position, so these
// batches are bitwise those the uninterrupted run would have built. Built for one epoch:
// asking it for another is an error (use base for the following epochs). start must be at
// most base.size(); start = (batches trained) * batch size of this rank.
class SkipSampler : public Sampler {
 public:
  SkipSampler(std::shared_ptr<const Sampler> base, int64_t epoch, size_t start);
  size_t size() const override;
  std::vector<size_t> indices(int64_t epoch) const override;

 private:
  std::shared_ptr<const Sampler> base_;
  int64_t epoch_;
  size_t start_;
};

// A uniformly random permutation of 0..n-1 (Fisher-Yates on a Generator seeded with seed).
std::vector<size_t> random_permutation(size_t n, uint64_t seed);

}  // namespace dpar::data
