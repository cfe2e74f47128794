#pragma once
// The collectives of a Gloo group whose ranks all run on one host, through shared memory.
//
// Ranks on one host otherwise exchange through TCP loopback (0.7 GB/s here, where Open MPI's
// shared-memory allreduce reaches 3 GB/s). Here every rank maps one segment: a control block
// (per rank: its barrier counter and pid, and what it is calling) and two sets of per-rank slots,
// used in turn. Every collective but barrier goes piece by piece, a barrier after each piece is
// copied in:
//
// - allreduce and reduce_scatter: the buffer is split into chunks exactly as the ring splits it
//   (allreduce_chunk_bounds, or the caller's uneven chunks), each chunk into pieces that fit a
//   slot. For each piece every rank copies its pieces of all chunks into its slot; a barrier;
//   rank c folds chunk c's piece over the slots in the ring's order (the contribution of rank
//   c+1, then c+2 (op) that, ..., rank c's last) and applies `finish` (an average's division).
//   The ring reduce-scatter folds each element in that same order with the same reduction
//   functions, so the result is bitwise the Gloo ring's: switching transport never changes a bit.
//   An allreduce's owner leaves its result in its slot; a second barrier; every rank copies every
//   chunk's result out. A reduce-scatter's owner folds straight into its output.
// - allgather: each rank copies its piece into its slot; a barrier; every rank copies all out.
// - broadcast: the root copies a piece into the whole slot set; a barrier; the others copy it out.
//
// Why one barrier per piece suffices: a slot set is written again only two pieces later, after a
// barrier that every rank reaches only once it has finished reading the set.
//
// Same host means same machine (boot id, hostname) and the same network and pid namespaces: two
// network namespaces are two hosts (as dpar-launch's and the tests' namespace hosts are), and a
// peer's pid is checked for life while waiting. Waits spin briefly, then sleep on a futex, so a
// rank waiting for a slower peer does not take the core from the training threads. A peer that
// dies is named at once; one that stalls past the timeout is named by the group's timeout path.
// Ranks that call different collectives (or sizes, chunk splits, dtypes, reduce ops or roots) all
// fail naming both calls, where over TCP the transport would fail them (or pass a different dtype
// or op silently) and here the segment would hand back a silent mix. A rank whose collective
// fails, or whose group is aborted, says so in the segment (give_up), and the ranks waiting for
// it fail at once naming it, as closed sockets tell TCP peers.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/gloo/checked_ring.h"
#include "distributed/gloo/reduce_functions.h"
#include "distributed/gloo/shm_common.h"
#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

class ShmCollectives {
 public:
  using Cancelled = std::function<std::string()>;

  // Collective over the group's (prefixed) store, for ranks whose host identities (as
  // exchange_host_identities gave them) all match: rank 0 creates the segment and the others map
  // it. Every rank gets the same answer: the transport, or nullptr with the reason in *why_not
  // (a segment that could not be made; the group then runs over Gloo alone).
  static std::unique_ptr<ShmCollectives> connect(Store& store, int rank, int size, Millis timeout,
                                                 std::string* why_not);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // Every call below is collective. `cancelled` is asked while waiting: a non-empty answer ends
  // the wait with that error (the group's abort). Failures throw ShmFailure.

  // In place on `data`: `bounds` are allreduce_chunk_bounds(numel, size, element_size); on
  // return every element holds the reduction over the ranks, in the ring's order, `finish` (may
  // be empty) applied by each chunk's owner.
  void allreduce(uint8_t* data, const std::vector<int64_t>& bounds, DType dtype, ReduceOp op,
                 ReduceFn reduce, const ChunkFn& finish, Millis timeout,
                 const Cancelled& cancelled);

  // chunks[r] (chunk_bytes[r] bytes, the same sizes on every rank) is this rank's contribution to
  // rank r's result. On return `out` (chunk_bytes[rank] bytes, not overlapping the chunks) holds
  // the reduction of chunk `rank` over the ranks in the ring's order, `finish` applied.
  void reduce_scatter(const std::vector<const uint8_t*>& chunks,
                      const std::vector<size_t>& chunk_bytes, uint8_t* out, DType dtype,
                      ReduceOp op, ReduceFn reduce, const ChunkFn& finish, Millis timeout,
                      const Cancelled& cancelled);

  // On return outputs[r] holds rank r's `mine` (chunk_bytes[r] bytes). `mine` may be
  // outputs[rank] itself.
  void allgather(const uint8_t* mine, const std::vector<uint8_t*>& outputs,
                 const std::vector<size_t>& chunk_bytes, DType dtype, Millis timeout,
                 const Cancelled& cancelled);

  // On return every rank's `data` holds the root's `bytes` bytes.
  void broadcast(uint8_t* data, size_t bytes, int root, Millis timeout, const Cancelled& cancelled);

  // Returns once every rank has called it.
  void barrier(Millis timeout, const Cancelled& cancelled);

  // This rank gives up on the group (its collective failed, or it was aborted): the waits of the
  // other ranks fail at once with "rank <r> gave up on the collective: <why>". Safe from any
  // thread; the first rank to give up is the one named.
  void give_up(const std::string& why);

  // Bytes of one slot (what each rank copies in per piece): 1 MiB, less for many ranks so the
  // segment stays within 64 MiB.
  static size_t slot_bytes(int size);

  // What a rank is calling, for the check after the call's first barrier.
  enum class Kind : uint32_t { allreduce = 1, reduce_scatter, allgather, broadcast, barrier };

 private:
  struct Call {
    Kind kind;
    std::optional<DType> dtype;  // none: bytes
    std::optional<ReduceOp> op;
    int root;
    uint64_t bytes;
    const std::vector<size_t>* chunk_bytes;  // uneven chunks, compared; null: none
  };

  ShmCollectives(int rank, int size, uint8_t* base, size_t bytes);
  uint8_t* slot(int set, int rank) const;
  // The slot set the next piece uses (they alternate).
  int next_set() { return static_cast<int>(pieces_++ % 2); }
  // Marks this rank's arrival at the next barrier and waits for every rank's.
  void wait_for_all(Millis timeout, const Cancelled& cancelled);
  // Publishes this rank's call (before its first barrier).
  void begin_call(const Call& call);
  // Throws ShmFailure when another rank's call differs (read after the call's first barrier).
  void check_call() const;
  // Another rank's give_up line, or empty (asked by every wait).
  std::string peer_gave_up() const;
  // The ring's reduction of chunk `rank` over the ranks, piece by piece (allreduce and
  // reduce_scatter): `out_own` null leaves each piece's result in this rank's slot for `copy_out`.
  struct Fold {
    const std::vector<const uint8_t*>& chunks;
    const std::vector<size_t>& chunk_bytes;
    size_t element_size;
    ReduceFn reduce;
    const ChunkFn& finish;
    uint8_t* out_own;                       // reduce_scatter: where this rank's result goes
    const std::vector<uint8_t*>* copy_out;  // allreduce: where every chunk's result goes
  };
  void fold_pieces(const Fold& f, Millis timeout, const Cancelled& cancelled);

  const int rank_, size_;
  uint8_t* base_;
  size_t bytes_;
  size_t slot_bytes_;
  uint32_t barriers_ = 0;       // barriers passed; equal on every rank between collectives
  uint64_t calls_ = 0;          // collectives called: which of two call records is this one's
  uint64_t pieces_ = 0;         // pieces done: which slot set the next one uses
  std::vector<uint8_t> fold_;   // the running partial of this rank's chunk piece
  std::vector<ShmPeer> peers_;  // per rank, watched while waiting for it
};

}  // namespace dpar::dist::detail
