#pragma once
// What the shared-memory transports have in common (shm_collectives.h: every rank of a group on
// one host; shm_link.h: one ring hop between two ranks of a host): host identity, segments,
// counters another process advances, and waiting on them without hanging on a dead or failed
// peer.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

// A shared-memory collective that cannot finish: it reached the group timeout (handled as a
// Gloo timeout is: the group fails, naming the ranks that have not arrived), a peer process is
// gone, gave up, or the group was aborted. The ranks are out of step afterwards: the group fails.
struct ShmFailure : std::runtime_error {
  ShmFailure(const std::string& what, bool timed_out)
      : std::runtime_error(what), timed_out(timed_out) {}
  bool timed_out;
};

// This process's host identity as the shared-memory transports see it: boot id, hostname and
// the inodes of the network and pid namespaces. Two network namespaces are two hosts (as
// dpar-launch's and the tests' namespace hosts are).
std::string shm_host_identity();

// Every rank's host identity, exchanged over the (prefixed) store under "shm/host/<rank>".
// `mine` is what this rank publishes (normally shm_host_identity()).
std::vector<std::string> exchange_host_identities(Store& store, int rank, int size,
                                                  const std::string& mine, Millis timeout);

// A counter in shared memory that one process advances and others wait on, with the number of
// waiters asleep on it (so an advance without sleepers costs no system call). One cache line.
struct alignas(64) ShmCounter {
  std::atomic<uint32_t> value;     // wraps; compared by difference
  std::atomic<uint32_t> sleepers;  // processes asleep on `value`
  std::atomic<int32_t> pid;        // the process that advances it
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "counter words must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words are 32 bits");

// Sets the counter and wakes its sleepers.
void shm_advance(ShmCounter& counter, uint32_t value);
// Wakes whoever sleeps on the counter (after a change they must see, e.g. a failure).
void shm_wake(ShmCounter& counter);

// A shared segment: created (sized and backed first, so a full /dev/shm is an error here
// rather than a SIGBUS at the first touch) or opened by name.
struct ShmMapping {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  std::string error;  // why base is null
};
ShmMapping map_shm_segment(const std::string& name, size_t bytes, bool create);
// A fresh segment name for this process.
std::string new_shm_segment_name(const char* what);

// The process of a peer rank, watched for exit while this one waits on it: a pidfd turns
// readable the moment it exits, before its parent reaps it, as a TCP peer's socket closes.
// Where pidfd_open is missing, kill(pid, 0) is asked instead.
class ShmPeer {
 public:
  ShmPeer() = default;
  ShmPeer(int rank, int32_t pid);
  ~ShmPeer();
  ShmPeer(ShmPeer&& other) noexcept;
  ShmPeer& operator=(ShmPeer&& other) noexcept;
  ShmPeer(const ShmPeer&) = delete;
  ShmPeer& operator=(const ShmPeer&) = delete;

  int rank() const { return rank_; }
  bool exited() const;

 private:
  int rank_ = -1;
  int32_t pid_ = 0;
  int pidfd_ = -1;
};

// What a wait asks after each nap, besides the counter: a non-empty answer ends it with
// ShmFailure(answer) (e.g. the peer gave up on the collective).
using ShmCheck = std::function<std::string()>;

// Waits until `counter` reaches `target` (by wrapping difference). Spins briefly, then sleeps on
// a futex in 1 ms naps so a rank waiting for a slower peer does not take the core from the
// training threads. After every nap: the peer's exit and `check`; every 16 naps: `cancelled`
// (the group's abort) and the deadline. Throws ShmFailure for each.
void shm_wait(ShmCounter& counter, uint32_t target, const ShmPeer& peer, const ShmCheck& check,
              std::chrono::steady_clock::time_point deadline, Millis timeout,
              const std::function<std::string()>& cancelled);

}  // namespace dpar::dist::detail
