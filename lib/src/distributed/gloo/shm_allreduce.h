#pragma once
// Allreduce through shared memory, for a Gloo group whose ranks all run on one host.
//
// Ranks on one host otherwise reduce through TCP loopback (0.7 GB/s here, where Open MPI's
// shared-memory allreduce reaches 3 GB/s). Here every rank maps one segment: a control block
// (one cache line per rank: its barrier counter and pid) and two sets of per-rank slots, used in
// turn. The buffer is split into chunks exactly as the ring allreduce splits it
// (allreduce_chunk_bounds), and each chunk into pieces that fit a slot. For each piece: every
// rank copies its pieces of all chunks into its slot; a barrier; rank c folds chunk c's piece
// over the slots in the ring's order (the contribution of rank c+1, then c+2 (op) that, ...,
// rank c's last), divides it for an average, and leaves the result in its own slot; a barrier;
// every rank copies every chunk's result out. The ring reduce-scatter folds each element in
// that same order with the same reduction functions, so the result is bitwise equal to the Gloo
// ring's: switching transport never changes a bit.
//
// Same host means same machine (boot id, hostname) and the same network and pid namespaces: two
// network namespaces are two hosts (as dpar-launch's and the tests' namespace hosts are), and a
// peer's pid is checked for life while waiting. Waits spin briefly, then sleep on a futex, so a
// rank waiting for a slower peer does not take the core from the training threads. A peer that
// dies is named at once; one that stalls past the timeout is named by the group's timeout path.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/gloo/checked_ring.h"
#include "distributed/gloo/reduce_functions.h"
#include "distributed/gloo/shm_common.h"
#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

class ShmAllreduce {
 public:
  // Collective over the group's (prefixed) store, for ranks whose host identities (as
  // exchange_host_identities gave them) all match: rank 0 creates the segment and the others map
  // it. Every rank gets the same answer: the transport, or nullptr with the reason in *why_not
  // (a segment that could not be made; the group then reduces over Gloo alone).
  static std::unique_ptr<ShmAllreduce> connect(Store& store, int rank, int size, Millis timeout,
                                               std::string* why_not);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // In place on `data`: `bounds` are allreduce_chunk_bounds(numel, size, element_size); on
  // return every element holds the reduction over the ranks, in the ring's order, `finish` (may
  // be empty) applied by each chunk's owner. `cancelled` is asked while waiting: a non-empty
  // answer ends the wait with that error (the group's abort).
  void allreduce(uint8_t* data, const std::vector<int64_t>& bounds, size_t element_size,
                 ReduceFn reduce, const ChunkFn& finish, Millis timeout,
                 const std::function<std::string()>& cancelled);

  // Bytes of one slot (what each rank copies in per piece): 1 MiB, less for many ranks so the
  // segment stays within 64 MiB.
  static size_t slot_bytes(int size);

 private:
  ShmAllreduce(int rank, int size, uint8_t* base, size_t bytes);
  uint8_t* slot(int set, int rank) const;
  // Marks this rank's arrival at the next barrier and waits for every rank's.
  void barrier(Millis timeout, const std::function<std::string()>& cancelled);
  // Throws ShmFailure when another rank's call reduces other sizes (read after a barrier).
  void check_same_call(int64_t numel, size_t element_size) const;

  const int rank_, size_;
  uint8_t* base_;
  size_t bytes_;
  size_t slot_bytes_;
  uint32_t barriers_ = 0;       // barriers passed; equal on every rank between collectives
  uint64_t pieces_ = 0;         // pieces done: which slot set the next one uses
  std::vector<uint8_t> fold_;   // the running partial of this rank's chunk piece
  std::vector<ShmPeer> peers_;  // per rank, watched while waiting for it
};

}  // namespace dpar::dist::detail
