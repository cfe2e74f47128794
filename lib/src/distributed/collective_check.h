#pragma once
// What a collective call is (kind, dtype, shapes, root, sequence number) in a form that can be
// printed in error messages and exchanged between ranks as a fixed-size fingerprint, so that
// DPAR_DEBUG=DETAIL can verify that every rank issues the same collective before running it.
// Backend independent: the Gloo group exchanges fingerprints with a Gloo allgather; an NCCL
// group can reuse the same checks.
#include <cstdint>
#include <string>
#include <vector>

#include "dpar/distributed/process_group.h"

namespace dpar::dist::detail {

enum class CollectiveKind : int32_t { Allreduce, Broadcast, Allgather, ReduceScatter, Barrier };
const char* collective_name(CollectiveKind kind);

// One collective call as this rank issued it.
struct CollectiveInfo {
  CollectiveKind kind = CollectiveKind::Barrier;
  int64_t seq = 0;  // 1-based position of this call in the group's issue order
  DType dtype = DType::f32;
  ReduceOp reduce_op = ReduceOp::Sum;
  int root = 0;
  int ntensors = 0;
  int64_t numel = 0;         // over all tensors that every rank passes alike (see describe_call)
  Shape shape;               // the first such tensor's shape
  uint64_t shapes_hash = 0;  // hash of every such tensor's shape, so any difference shows

  // "allreduce(f32[1000])", "allreduce(f32[4,5] +2 more, 37 elements, max)", "barrier()".
  std::string describe() const;
};

// Builders: the tensors that must agree across ranks are allreduce/broadcast's tensors,
// allgather's input and reduce_scatter's inputs.
CollectiveInfo describe_call(CollectiveKind kind, const std::vector<Tensor>& tensors, ReduceOp op,
                             int root);

// "3 s", "1500 ms": a timeout as the failure lines print it.
std::string format_duration(Millis t);

// Noted by a group that failed (a timeout, a lost peer): the other ranks cannot finish their
// collectives either, so destroy() on rank 0 then keeps the store up for them only briefly
// instead of its full grace period (a stopped peer would hold the failing job 30 s longer).
void note_group_failed();
bool any_group_failed();

// Fixed-size, trivially copyable summary exchanged between ranks.
struct Fingerprint {
  static constexpr int kMaxDims = 8;
  int64_t seq;
  int64_t numel;
  uint64_t shapes_hash;
  int64_t dims[kMaxDims];
  int32_t kind;
  int32_t dtype;
  int32_t reduce_op;
  int32_t root;
  int32_t ntensors;
  int32_t ndim;  // of the first tensor; dims beyond kMaxDims are folded into the hash only
  int32_t world_size;
  int32_t reserved;
};

Fingerprint make_fingerprint(const CollectiveInfo& info, int world_size);
std::string describe(const Fingerprint& fp);
// Compares the gathered fingerprints (one per rank, in rank order). Returns an empty string
// when they agree, else one line naming the first rank that differs from rank 0, e.g.
// "collective mismatch at #12: rank 0 called allreduce(f32[1000]) but rank 1 called
// allreduce(f32[999])". Every rank computes the same text from the same data.
std::string find_mismatch(const std::vector<Fingerprint>& all);

}  // namespace dpar::dist::detail
