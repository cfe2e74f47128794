#pragma once
#include <cstdint>
#include <mutex>
#include <random>
#include <string>

namespace dpar {

// One generator, explicitly seeded, so CPU runs are bitwise reproducible. Its state can be
// saved and restored (checkpoints) as a string.
//
// Threads may share a generator (the default one, when ranks run as threads or models are
// built on several threads): bulk draws (weight init, dropout masks) hold mutex() for the
// whole fill, so fills take turns instead of corrupting the engine; copying, assigning and
// state() lock too. Single draws (uniform(), normal(), next_u64()) are not locked: a caller
// mixing them across threads holds mutex() itself.
class Generator {
 public:
  explicit Generator(uint64_t seed = 5489u) : engine_(seed) {}
  Generator(const Generator& other);  // copies the state, not the lock
  Generator& operator=(const Generator& other);
  void seed(uint64_t s) { engine_.seed(s); }
  uint64_t next_u64() { return engine_(); }
  // Uniform in [0, 1) with 24 random bits, identical on every platform.
  float uniform() { return static_cast<float>(engine_() >> 40) * (1.0f / 16777216.0f); }
  // Standard normal via Box-Muller; platform independent (no std::normal_distribution).
  float normal();
  std::string state() const;
  void set_state(const std::string& s);
  std::mutex& mutex() const { return mutex_; }

 private:
  mutable std::mutex mutex_;
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  float spare_ = 0;
};

// The process-wide default generator (weight init, dropout, data augmentation defaults).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace dpar
