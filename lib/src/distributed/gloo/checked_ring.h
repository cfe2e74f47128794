#pragma once
// Ring reduce-scatter and allgather over Gloo's unbound buffers, every hop checked by CRC-32C.
//
// Why dpar runs its own rings instead of gloo::allreduce / gloo::allgather: Gloo's TCP transport
// sends tensor bytes with no checksum of its own, and TCP's 16-bit sum (often computed by the
// NIC, after the bytes left memory) misses what a faulty NIC, switch buffer or middlebox does to
// them. A flipped bit then changes a gradient sum silently and every rank adopts it. Here the
// segments of each chunk a rank sends are followed by their CRC-32Cs, in one message on a slot
// of their own (a chunk of at most 64 KiB is copied to a staging slot with its CRC behind it
// and travels as one message); the receiver takes the CRC of every segment as it arrives and
// compares before the step ends, so nothing that failed is sent on or returned, and a mismatch
// throws CorruptedTransfer naming both ranks and the bytes. An allreduce is a reduce-scatter
// followed by an allgather (what Gloo's ring allreduce does too), so its every byte is checked on
// every hop.
//
// The reduce-scatter takes uneven chunks (Gloo has none for unbound buffers; its old-style
// ReduceScatterHalvingDoubling needs per-call setup and a fixed reduction type): each rank sends
// (N-1)/N of the data once, half of what an allreduce of the concatenation would send.
#include <gloo/context.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "distributed/gloo/reduce_functions.h"
#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

// Bytes that arrived from a peer differ from what it sent; the ring is left mid-way, so the
// group cannot be used again.
struct CorruptedTransfer : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws CorruptedTransfer when the CRC of bytes [offset, offset + length) of a `total`-byte
// collective, as `rank` received them from `prev`, differs from the one `prev` sent.
void check_transfer(int rank, int prev, size_t offset, size_t length, size_t total, uint32_t got,
                    uint32_t sent);

// What a ring collective works on: `data` holds the concatenation of size() chunks, chunk r
// being chunk_bytes[r] bytes (equal on every rank), each a whole number of elements.
struct RingBuffer {
  uint8_t* data = nullptr;
  std::vector<size_t> chunk_bytes;
  size_t element_size = 1;
};

// Reused between calls: where segments arrive before they are reduced, the CRCs, and the two
// staging slots of small chunks.
struct RingScratch {
  std::vector<uint8_t> segments, inline_slots;
  std::vector<uint32_t> sent_crcs, received_crcs, next_crcs, arrived_crcs;
};

// On return chunk rank() holds the reduction over all ranks; what the other chunks hold is
// unspecified (partial sums). Throws gloo::Exception on timeout or transport failure,
// CorruptedTransfer on a checksum mismatch.
void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                         ReduceFn reduce, uint32_t tag, Millis timeout, RingScratch& scratch);

// On entry chunk rank() holds this rank's part; on return every chunk holds its owner's.
void ring_allgather(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                    uint32_t tag, Millis timeout, RingScratch& scratch);

// Work on this rank's reduced chunk between the two halves of an allreduce (count elements).
using ChunkFn = std::function<void(uint8_t* data, size_t count)>;

// A reduce-scatter, then `finish` (may be empty; e.g. the division of an average) on this rank's
// chunk, then an allgather: on return every chunk holds the finished reduction on every rank.
void ring_allreduce(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                    ReduceFn reduce, const ChunkFn& finish, uint32_t tag, Millis timeout,
                    RingScratch& scratch);

}  // namespace dpar::dist::detail
