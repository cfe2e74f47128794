#pragma once
// bench_ddp's lockstep ceiling: independent processes (no data exchanged) that wait for each
// other after every step, as the ranks of a synchronous job do. Stepping together is not free
// on a machine whose cores share caches and memory bandwidth: every process runs its
// bandwidth-bound layers at the same moment, where free-running processes drift apart and
// overlap one's convolutions with another's batch norm. This ceiling separates that cost from
// what DataParallel itself adds.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "dpar/core/error.h"

namespace dpar::bench {

// `world` processes share one page of a file (under /dev/shm): slot r holds how many steps
// process r has finished. arrive(step) publishes this process's and waits until every slot
// has reached it.
class StepBarrier {
 public:
  StepBarrier(const std::string& path, int world, int rank) : world_(world), rank_(rank) {
    DPAR_CHECK(world >= 1 && world <= kMaxWorld && rank >= 0 && rank < world,
               "bench_ddp: lockstep barrier: rank ", rank, " of ", world, " (at most ", kMaxWorld,
               ")");
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
    DPAR_CHECK(fd >= 0, "bench_ddp: cannot open the lockstep file ", path);
    // Every process sizes it alike; ftruncate to the size it has keeps what is there.
    const bool sized = ::ftruncate(fd, kBytes) == 0;
    void* p =
        sized ? ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    ::close(fd);
    DPAR_CHECK(p != MAP_FAILED, "bench_ddp: cannot map the lockstep file ", path);
    slots_ = static_cast<int64_t*>(p);
  }
  ~StepBarrier() { ::munmap(slots_, kBytes); }
  StepBarrier(const StepBarrier&) = delete;
  StepBarrier& operator=(const StepBarrier&) = delete;

  void arrive(int64_t step) {
    std::atomic_ref<int64_t>(slots_[rank_]).store(step + 1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    for (int r = 0; r < world_; ++r) {
      // A short spin, then yield: on a machine with fewer cores than processes the others
      // need this one's core to get here.
      for (int64_t spins = 0; std::atomic_ref<int64_t>(slots_[r]).load() < step + 1; ++spins) {
        if (spins > 1000) ::sched_yield();
        DPAR_CHECK(spins % 4096 != 0 || std::chrono::steady_clock::now() < deadline,
                   "bench_ddp: lockstep: process ", r, " did not finish step ", step,
                   " within 10 minutes");
      }
    }
  }

 private:
  static constexpr int kMaxWorld = 512;
  static constexpr size_t kBytes = kMaxWorld * sizeof(int64_t);
  int world_, rank_;
  int64_t* slots_ = nullptr;
};

}  // namespace dpar::bench
