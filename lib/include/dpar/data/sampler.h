#pragma once
// Samplers decide which dataset indices an epoch visits, in which order. indices(epoch) is a
// pure function of the sampler's configuration and the epoch, so every process and every
// restart sees the same order.
#include <cstddef>
#include <cstdint>
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
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(size_t n, int64_t rank, int64_t world_size, bool shuffle = true,
                     uint64_t seed = 0);
  size_t size() const override;
  std::vector<size_t> indices(int64_t epoch) const override;

 private:
  size_t n_;
  int64_t rank_;
  int64_t world_size_;
  bool shuffle_;
  uint64_t seed_;
};

// A uniformly random permutation of 0..n-1 (Fisher-Yates on a Generator seeded with seed).
std::vector<size_t> random_permutation(size_t n, uint64_t seed);

}  // namespace dpar::data
