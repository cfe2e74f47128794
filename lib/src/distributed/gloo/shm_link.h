#pragma once
// One hop of the ring between two ranks of one host, through shared memory: the producer (rank
// r) copies each segment into the next free slot, the consumer (rank r+1) reads it in place (a
// reduce-scatter folds straight from the slot) and frees it. The hierarchical allreduce
// (hybrid_ring.h) takes these for the ring's hops inside a host and Gloo's TCP pairs for the hops
// between hosts.
//
// A side that gives up on a collective (its other hop failed, a timeout, an abort) marks the link
// broken with its reason, so the rank across it fails at once, naming why, instead of waiting
// out the timeout for a segment that will never come.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/gloo/shm_common.h"

namespace dpar::dist::detail {

class ShmLink {
 public:
  static constexpr int kSlots = 4;
  static constexpr size_t kSlotBytes = 1 << 20;

  ~ShmLink();
  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  // Producer: waits for a free slot (the consumer has released the one kSlots back), copies
  // `bytes` (at most kSlotBytes) into it and publishes it.
  void send(const uint8_t* data, size_t bytes, std::chrono::steady_clock::time_point deadline,
            Millis timeout, const std::function<std::string()>& cancelled);
  // Consumer: waits for the next segment and returns it, valid until release(). Throws
  // ShmFailure when its length is not `bytes` (the two ranks called different collectives).
  const uint8_t* receive(size_t bytes, std::chrono::steady_clock::time_point deadline,
                         Millis timeout, const std::function<std::string()>& cancelled);
  void release();
  // Either side, when it gives up on the collective: the other side's waits fail with `why`.
  void mark_broken(const std::string& why);

  int peer() const { return peer_.rank(); }

 private:
  friend struct RingLinks connect_ring_links(Store&, int, int, const std::vector<std::string>&,
                                             Millis, std::string*);
  struct Control;
  ShmLink(ShmMapping mapping, bool producer, int me, ShmPeer peer);
  Control& control() const;
  uint8_t* slot(uint64_t index) const;
  ShmCheck broken_check() const;

  ShmMapping mapping_;
  bool producer_;
  int me_;
  ShmPeer peer_;
  uint64_t sent_ = 0, consumed_ = 0;  // this side's count of segments sent / released
};

// This rank's two hops of the ring, each through shared memory where its neighbour shares the
// host, else null (TCP).
struct RingLinks {
  std::unique_ptr<ShmLink> to_next, from_prev;
  int shm_hops = 0;     // hops of the whole ring through shared memory
  std::string summary;  // e.g. "shared memory within hosts (2 of 4 ring hops), tcp between them"
  // Whether the group runs the mixed ring: every rank asks the same (a rank with no hop of its
  // own through shared memory still runs the ring its neighbours run).
  bool in_use() const { return shm_hops > 0; }
  void mark_broken(const std::string& why);
};

// Collective over the store, given every rank's host identity (exchange_host_identities):
// links for the hops between neighbours of one host. `why_not` says why none is shared memory.
RingLinks connect_ring_links(Store& store, int rank, int size,
                             const std::vector<std::string>& hosts, Millis timeout,
                             std::string* why_not);

}  // namespace dpar::dist::detail
