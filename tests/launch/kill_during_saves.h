#pragma once
// For the shard-set kill tests (tests/multiproc/shard_worker.cpp, tests/torch/
// torch_shard_worker.cpp): rank 1 dies by SIGKILL in the middle of saving optimizer shard sets.
// A watcher thread polls (without sleeping) for rank 1's own file of the set being saved -
// its <file>.tmp while safetensors writes it, or the file - and raises SIGKILL on sight. One
// save takes milliseconds and a watcher thread may not be scheduled within them on a loaded
// machine, so the caller saves set_b_0, set_b_1, ... until the kill lands: every set under its
// final name must be whole, and one being saved is left as .tmp if any was in progress when
// the job ended (the shell side, expect_no_partial_sets in checks.sh, checks this).
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

namespace dpar::testing {

// save(path) saves one set on every rank; returns only if rank 1 survived `sets` saves.
inline void save_sets_until_rank1_dies(const std::string& dir, int rank, int world, int sets,
                                       const std::function<void(const std::string&)>& save) {
  static std::atomic<int> current{0};
  auto set_path = [dir](int k) { return dir + "/set_b_" + std::to_string(k); };
  if (rank == 1) {
    std::thread([set_path, world] {
      for (;;) {
        const std::string mine =
            set_path(current.load()) + ".tmp/rank-1-of-" + std::to_string(world) + ".safetensors";
        if (std::filesystem::exists(mine + ".tmp") || std::filesystem::exists(mine)) break;
        std::this_thread::yield();
      }
      std::printf("rank 1: killing myself with SIGKILL while set_b_%d is saved\n", current.load());
      std::fflush(stdout);
      std::raise(SIGKILL);
    }).detach();
  }
  for (int k = 0; k < sets; ++k) {
    current = k;
    save(set_path(k));
  }
  std::printf("rank %d: %d sets were saved although rank 1 should have died\n", rank, sets);
}

}  // namespace dpar::testing
