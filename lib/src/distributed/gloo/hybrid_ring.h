#pragma once
// The hierarchical allreduce (and reduce-scatter and allgather) of a group spread over several
// hosts with several ranks on some: the ring collectives of checked_ring.h, whose hops between
// two ranks of one host go through shared memory (shm_link.h) and whose hops between hosts go
// through Gloo's TCP pairs, every TCP segment checked by CRC-32C. Its broadcast runs along the
// same hops as a chain.
//
// Why a ring with mixed hops rather than "reduce within each host, allreduce between hosts,
// broadcast within each host": dpar promises that switching transport never changes a bit, and
// the ring fixes the order of every sum (chunk c is folded starting at rank c+1, then c+2, ...,
// each hop computing own (op) arrived). A host-first reduction folds in another order, so its
// result differs in the last bits from the TCP ring's whenever the sums round. The mixed ring
// keeps the ring's order exactly. Its traffic between hosts is the ring's: the one hop out of
// each host carries 2(n-1)/n of the data (n ranks), where a host-level allreduce would carry
// 2(h-1)/h (h hosts): 1.5x as much for 2 hosts of 2 ranks, the price of reproducible sums. What
// it saves is the loopback TCP of every hop inside a host: its system calls, copies and checksums.
#include <gloo/context.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "distributed/gloo/checked_ring.h"
#include "distributed/gloo/shm_link.h"

namespace dpar::dist::detail {

// Reused between calls: where TCP segments arrive, where a small chunk is staged with its CRC,
// and the CRCs of the segments that travel apart from theirs.
struct HybridScratch {
  std::vector<uint8_t> segments, out_stage;
  std::vector<uint32_t> sent_crcs, received_crcs;
};

// Reduce-scatter, `finish` on this rank's chunk (may be empty), allgather; on return every chunk
// holds the finished reduction, bitwise what ring_allreduce gives. Throws gloo::Exception (TCP
// hop timeout or failure), ShmFailure (shared-memory hop: peer exited, gave up, timeout, abort)
// or CorruptedTransfer (a TCP segment failed its CRC).
void hybrid_ring_allreduce(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                           const RingBuffer& buffer, ReduceFn reduce, const ChunkFn& finish,
                           uint32_t tag, Millis timeout,
                           const std::function<std::string()>& cancelled, HybridScratch& scratch);

// Its two halves, as ring_reduce_scatter and ring_allgather (checked_ring.h): on return chunk
// rank() holds the reduction (the other chunks hold partial sums), or every chunk its owner's.
void hybrid_ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                                const RingBuffer& buffer, ReduceFn reduce, uint32_t tag,
                                Millis timeout, const std::function<std::string()>& cancelled,
                                HybridScratch& scratch);
void hybrid_ring_allgather(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                           const RingBuffer& buffer, uint32_t tag, Millis timeout,
                           const std::function<std::string()>& cancelled, HybridScratch& scratch);

// Broadcast of `bytes` at `data` from `root` along the same mixed ring: a chain root, root+1,
// ..., root-1, cut into segments that each rank passes on as they arrive (a pipeline), every hop
// inside a host through shared memory, every TCP hop checked by CRC-32C. The bytes cross each
// boundary between hosts on the ring once, and a hop inside a host costs a copy instead of
// loopback TCP. A CRC failure mid-chain leaves the receiving ranks' tensors partly overwritten
// (the segments before it), where Gloo's tree leaves them unchanged; the group fails either way.
void hybrid_chain_broadcast(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                            uint8_t* data, size_t bytes, int root, uint32_t tag, Millis timeout,
                            const std::function<std::string()>& cancelled, HybridScratch& scratch);

// Whether a broadcast of `bytes` over a mixed ring of `size` ranks, `shm_hops` of its hops
// through shared memory, goes along the chain rather than Gloo's tree (log2(size) rounds, each
// carrying the whole message over TCP). Ranks that broadcast the same bytes decide alike; ranks
// that pass different sizes may not, and then wait until the timeout (DPAR_DEBUG=DETAIL names
// such a mismatch before the call). A model, measured only for two hosts of two ranks, where the
// chain won at every size from 1 KB to 16 MB (docs/architecture.md):
//  - one segment (up to ShmLink::kSlotBytes): latency counts, so the chain is taken while its
//    TCP hops are no more than the tree's rounds and all its hops no more than twice as many;
//  - several: while its TCP hops are no more than the tree's rounds, and beyond that once the
//    message is long enough: the pipelined chain costs about one TCP transfer of the message
//    plus a segment per further hop (a shared-memory hop counted as a quarter of a TCP one),
//    the tree one transfer per round.
bool chain_broadcast_pays(int size, int shm_hops, size_t bytes);

}  // namespace dpar::dist::detail
