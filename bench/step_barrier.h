#pragma once
// bench_ddp's lockstep ceiling: independent processes (no data exchanged) that wait for each
// other after every step, as the ranks of a synchronous job do. Stepping together is not free
// on a machine whose cores share caches and memory bandwidth: every process runs its
// bandwidth-bound layers at the same moment, where free-running processes drift apart and
// overlap one's convolutions with another's batch norm. This ceiling tells that cost apart from
// what DataParallel itself adds.
//
// The waits are dpar's own shared-memory ones (distributed/gloo/shm_common.h): a short spin,
// then sleeping on a futex, so a waiting process costs what a waiting rank costs.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "distributed/gloo/shm_common.h"
#include "dpar/core/error.h"

namespace dpar::bench {

// A segment of one counter per process, made by the driver before it starts the processes and
// removed after they end (an object on the stack: also when the run fails).
class StepBarrierSegment {
 public:
  explicit StepBarrierSegment(int world)
      : name_(dist::detail::new_shm_segment_name("bench-lockstep")), bytes_(bytes_for(world)) {
    const dist::detail::ShmMapping m = dist::detail::map_shm_segment(name_, bytes_, true);
    DPAR_CHECK(m.base != nullptr, "bench_ddp: lockstep segment ", name_, ": ", m.error);
    ::munmap(m.base, m.bytes);  // zero-filled; the processes map it themselves
  }
  ~StepBarrierSegment() { ::shm_unlink(name_.c_str()); }
  StepBarrierSegment(const StepBarrierSegment&) = delete;
  StepBarrierSegment& operator=(const StepBarrierSegment&) = delete;

  const std::string& name() const { return name_; }
  static size_t bytes_for(int world) {
    return static_cast<size_t>(world) * sizeof(dist::detail::ShmCounter);
  }

 private:
  std::string name_;
  size_t bytes_;
};

// Process `rank` of `world`'s view of the segment: counter r holds how many steps process r
// has finished. arrive(step) publishes this process's and waits until every counter reached it;
// a process that exits or falls 10 minutes behind fails it (dist::detail::ShmFailure).
class StepBarrier {
 public:
  StepBarrier(const std::string& name, int world, int rank)
      : world_(world), rank_(rank), peers_(static_cast<size_t>(world)) {
    DPAR_CHECK(world >= 1 && rank >= 0 && rank < world, "bench_ddp: lockstep barrier: rank ", rank,
               " of ", world);
    const size_t bytes = StepBarrierSegment::bytes_for(world);
    const dist::detail::ShmMapping m = dist::detail::map_shm_segment(name, bytes, false);
    DPAR_CHECK(m.base != nullptr, "bench_ddp: lockstep segment ", name, ": ", m.error);
    counters_ = reinterpret_cast<dist::detail::ShmCounter*>(m.base);
    counters_[rank].pid.store(static_cast<int32_t>(::getpid()));
  }
  ~StepBarrier() { ::munmap(counters_, StepBarrierSegment::bytes_for(world_)); }
  StepBarrier(const StepBarrier&) = delete;
  StepBarrier& operator=(const StepBarrier&) = delete;

  void arrive(int64_t step) {
    const auto target = static_cast<uint32_t>(step + 1);
    dist::detail::shm_advance(counters_[rank_], target);
    const dist::Millis timeout = std::chrono::minutes(10);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      // Watched for exit once it has said who it is (it may not have started yet): shm_wait
      // asks the peer after every nap, and the check, run after it, fills it in once known.
      auto& peer = peers_[static_cast<size_t>(r)];
      auto learn_peer = [&]() -> std::string {
        if (peer.rank() < 0 && counters_[r].pid.load() > 0) {
          peer = dist::detail::ShmPeer(r, counters_[r].pid.load());
        }
        return "";
      };
      learn_peer();
      dist::detail::shm_wait(counters_[r], target, peer, learn_peer, deadline, timeout, {});
    }
  }

 private:
  int world_, rank_;
  std::vector<dist::detail::ShmPeer> peers_;
  dist::detail::ShmCounter* counters_ = nullptr;
};

}  // namespace dpar::bench
