#include "distributed/gloo/checked_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/crc32c.h"
#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

using dpar::detail::crc32c;

// Slot prefixes: Gloo's own collectives use 0x01..0x08 and the mesh handshake 0x41. A chunk's
// CRCs travel as one message behind its segments, on a slot of their own.
constexpr uint8_t kReduceScatterData = 0x40;
constexpr uint8_t kReduceScatterCrc = 0x42;
constexpr uint8_t kAllgatherData = 0x43;
constexpr uint8_t kAllgatherCrc = 0x44;
// Same bound as Gloo's allreduce: large enough to amortise per-message cost, small enough that
// two segments in flight stay in cache.
constexpr size_t kMaxSegmentBytes = 1 << 20;
// Chunks up to this size are copied into a staging buffer with their CRC behind them and travel
// as one message per hop: for small collectives a second message costs more than the copy.
constexpr size_t kInlineBytes = 64 << 10;
constexpr size_t kCrcBytes = sizeof(uint32_t);

// Where a ring collective stands: ranks, chunk offsets, the deadline.
class RingGeometry {
 public:
  RingGeometry(const gloo::Context& context, const RingBuffer& buffer, Millis timeout)
      : rank_(context.rank),
        size_(context.size),
        next_((rank_ + 1) % size_),
        prev_((rank_ + size_ - 1) % size_),
        buffer_(buffer),
        offset_(static_cast<size_t>(size_) + 1, 0),
        deadline_(std::chrono::steady_clock::now() + timeout) {
    for (int r = 0; r < size_; ++r) offset_[r + 1] = offset_[r] + chunk(r);
  }

  int rank() const { return rank_; }
  size_t chunk(int c) const { return buffer_.chunk_bytes[static_cast<size_t>(c)]; }
  uint8_t* chunk_data(int c) const { return buffer_.data + offset_[static_cast<size_t>(c)]; }
  Millis remaining() const {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline_ - std::chrono::steady_clock::now());
    return std::max(left, Millis(1));
  }

  // Throws CorruptedTransfer when the CRC of bytes [offset, offset + length) as they arrived
  // from the previous rank differs from the one it sent.
  void check(size_t offset, size_t length, uint32_t got, uint32_t sent) const {
    check_transfer(rank_, prev_, offset, length, offset_.back(), got, sent);
  }

 protected:
  const int rank_, size_, next_, prev_;
  const RingBuffer& buffer_;
  std::vector<size_t> offset_;
  const std::chrono::steady_clock::time_point deadline_;
};

// Large chunks, in place: cut into segments of at most kMaxSegmentBytes sent straight from
// `buffer`, each chunk's CRCs behind them in one message.
class SegmentedRing : public RingGeometry {
 public:
  SegmentedRing(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                uint8_t data_prefix, uint8_t crc_prefix, uint32_t tag, Millis timeout,
                RingScratch& scratch)
      : RingGeometry(*context, buffer, timeout),
        data_slot_(gloo::Slot::build(data_prefix, tag)),
        crc_slot_(gloo::Slot::build(crc_prefix, tag)),
        scratch_(scratch) {
    size_t largest = 0;
    for (int r = 0; r < size_; ++r) largest = std::max(largest, chunk(r));
    const size_t whole_elements = kMaxSegmentBytes / buffer.element_size * buffer.element_size;
    segment_ = std::max<size_t>(std::min(largest, whole_elements), 1);
    const size_t most = std::max<size_t>((largest + segment_ - 1) / segment_, 1);
    for (auto* v :
         {&scratch.sent_crcs, &scratch.received_crcs, &scratch.next_crcs, &scratch.arrived_crcs}) {
      if (v->size() < most) v->resize(most);
    }
    data_ = context->createUnboundBuffer(buffer.data, offset_.back());
    sent_ = context->createUnboundBuffer(scratch.sent_crcs.data(), most * kCrcBytes);
    received_ = context->createUnboundBuffer(scratch.received_crcs.data(), most * kCrcBytes);
  }

  int prev() const { return prev_; }
  size_t segment_bytes() const { return segment_; }
  size_t segments(int c) const { return (chunk(c) + segment_ - 1) / segment_; }
  size_t length(int c, size_t i) const { return std::min(segment_, chunk(c) - i * segment_); }
  size_t elements(int c, size_t i) const { return length(c, i) / buffer_.element_size; }
  size_t offset(int c, size_t i) const { return offset_[static_cast<size_t>(c)] + i * segment_; }
  uint8_t* at(int c, size_t i) const { return buffer_.data + offset(c, i); }
  uint64_t data_slot() const { return data_slot_; }
  gloo::transport::UnboundBuffer& data() { return *data_; }

  // Sends chunk c's segments to the next rank, then their CRCs in one message: taken here from
  // this rank's bytes (`own`, just before each segment goes, so the first leaves at once), or
  // already in scratch.sent_crcs.
  void send_chunk(int c, bool own) {
    const size_t n = segments(c);
    for (size_t i = 0; i < n; ++i) {
      if (own) scratch_.sent_crcs[i] = crc32c(at(c, i), length(c, i));
      data_->send(next_, data_slot_, offset(c, i), length(c, i));
    }
    if (n > 0) sent_->send(next_, crc_slot_, 0, n * kCrcBytes);
  }
  void wait_sends(int c) {
    const size_t n = segments(c);
    for (size_t i = 0; i < n; ++i) data_->waitSend(remaining());
    if (n > 0) sent_->waitSend(remaining());
  }

  // Posts the receive of chunk c's CRCs (into scratch.received_crcs).
  void expect_crcs(int c) {
    const size_t n = segments(c);
    if (n > 0) received_->recv(prev_, crc_slot_, 0, n * kCrcBytes);
  }

  // Takes the CRC of segment i of chunk c as it arrived, before anything is done with it.
  void arrived(int c, size_t i, const uint8_t* bytes) {
    scratch_.arrived_crcs[i] = crc32c(bytes, length(c, i));
  }

  // Waits for the sender's CRCs of chunk c and compares them with what arrived. Runs before the
  // step ends, so nothing that failed it is sent on or handed to the caller.
  void verify(int c) {
    const size_t n = segments(c);
    if (n == 0) return;
    received_->waitRecv(remaining());
    for (size_t i = 0; i < n; ++i)
      check(offset(c, i), length(c, i), scratch_.arrived_crcs[i], scratch_.received_crcs[i]);
  }

 private:
  size_t segment_ = 1;
  const uint64_t data_slot_, crc_slot_;
  RingScratch& scratch_;
  std::unique_ptr<gloo::transport::UnboundBuffer> data_, sent_, received_;
};

// Small chunks: three staging slots, each holding one chunk with its CRC behind it, so that a
// hop is one message.
class InlineRing : public RingGeometry {
 public:
  static constexpr int kSlots = 3;

  InlineRing(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
             uint8_t data_prefix, uint32_t tag, Millis timeout, RingScratch& scratch)
      : RingGeometry(*context, buffer, timeout), slot_id_(gloo::Slot::build(data_prefix, tag)) {
    size_t largest = 0;
    for (int r = 0; r < size_; ++r) largest = std::max(largest, chunk(r));
    stride_ = (largest + kCrcBytes + 63) / 64 * 64;  // slots stay aligned for every dtype
    if (scratch.inline_slots.size() < kSlots * stride_)
      scratch.inline_slots.resize(kSlots * stride_);
    base_ = scratch.inline_slots.data();
    for (int k = 0; k < kSlots; ++k) slots_[k] = context->createUnboundBuffer(slot(k), stride_);
  }

  uint8_t* slot(int k) const { return base_ + static_cast<size_t>(k) * stride_; }

  // Slot k holds chunk c's bytes: puts their CRC behind them.
  void seal(int k, int c) {
    const uint32_t crc = crc32c(slot(k), chunk(c));
    std::memcpy(slot(k) + chunk(c), &crc, kCrcBytes);
  }
  // Copies chunk c of the buffer into slot k and seals it.
  void load(int k, int c) {
    std::memcpy(slot(k), chunk_data(c), chunk(c));
    seal(k, c);
  }

  void post_recv(int k, int c) {
    if (chunk(c) > 0) slots_[k]->recv(prev_, slot_id_, 0, chunk(c) + kCrcBytes);
  }
  void send(int k, int c) {
    if (chunk(c) > 0) slots_[k]->send(next_, slot_id_, 0, chunk(c) + kCrcBytes);
  }
  void wait_send(int k, int c) {
    if (chunk(c) > 0) slots_[k]->waitSend(remaining());
  }
  // Waits for chunk c in slot k and checks it against the CRC behind it.
  void wait_recv(int k, int c) {
    if (chunk(c) == 0) return;
    slots_[k]->waitRecv(remaining());
    uint32_t sent = 0;
    std::memcpy(&sent, slot(k) + chunk(c), kCrcBytes);
    check(offset_[static_cast<size_t>(c)], chunk(c), crc32c(slot(k), chunk(c)), sent);
  }

 private:
  const uint64_t slot_id_;
  size_t stride_ = 0;
  uint8_t* base_ = nullptr;
  std::unique_ptr<gloo::transport::UnboundBuffer> slots_[kSlots];
};

bool fits_inline(const RingBuffer& buffer) {
  return std::all_of(buffer.chunk_bytes.begin(), buffer.chunk_bytes.end(),
                     [](size_t b) { return b <= kInlineBytes; });
}

size_t total_bytes(const RingBuffer& buffer) {
  size_t total = 0;
  for (size_t b : buffer.chunk_bytes) total += b;
  return total;
}

int wrap(int r, int n) { return (r % n + n) % n; }

// Step s of a reduce-scatter sends chunk (rank-s-1) to the next rank and reduces chunk
// (rank-s-2) received from the previous one. Chunk c starts at rank c+1 and picks up one
// contribution per hop, so after n-1 steps this rank holds chunk `rank` reduced over all ranks.
// The partial sum is always `own bytes (op) arrived bytes`, in that order, in both forms below,
// so both give the same bits.

// The hops of a small ring collective: `reduce_hops` reduce-scatter hops, then `gather_hops`
// allgather hops, each one message. Gloo sends a message only once the receiver has announced its
// receive, so the receive of hop t+1 is posted before hop t is waited for, taking that round trip
// off the critical path. Hop t receives into slot t%3 and sends slot (t+2)%3: the one that
// arrived in hop t-1, reduced in place during a reduce-scatter (then resealed), forwarded as it
// came during an allgather. After the last reduce hop, `finish` runs on this rank's chunk and the
// result is copied into the buffer.
void inline_hops(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                 ReduceFn reduce, int reduce_hops, int gather_hops, const ChunkFn& finish,
                 uint8_t slot_prefix, uint32_t tag, Millis timeout, RingScratch& scratch) {
  const int n = context->size;
  InlineRing ring(context, buffer, slot_prefix, tag, timeout, scratch);
  const int rank = ring.rank();
  const int hops = reduce_hops + gather_hops;
  auto send_chunk = [&](int t) {
    return wrap(t < reduce_hops ? rank - t - 1 : rank - (t - reduce_hops), n);
  };
  auto recv_chunk = [&](int t) { return wrap(send_chunk(t) - 1, n); };
  auto slot = [](int t) {
    return ((t % InlineRing::kSlots) + InlineRing::kSlots) % InlineRing::kSlots;
  };
  ring.load(slot(-1), send_chunk(0));
  ring.post_recv(slot(0), recv_chunk(0));
  for (int t = 0; t < hops; ++t) {
    const int out = slot(t - 1), in = slot(t), send_c = send_chunk(t), recv_c = recv_chunk(t);
    if (t + 1 < hops) ring.post_recv(slot(t + 1), recv_chunk(t + 1));
    ring.send(out, send_c);
    ring.wait_recv(in, recv_c);
    if (t < reduce_hops) {
      reduce(ring.slot(in), ring.chunk_data(recv_c), ring.slot(in),
             ring.chunk(recv_c) / buffer.element_size);
      if (t + 1 == reduce_hops) {  // this rank's chunk, complete
        if (finish) finish(ring.slot(in), ring.chunk(recv_c) / buffer.element_size);
        std::memcpy(ring.chunk_data(recv_c), ring.slot(in), ring.chunk(recv_c));
      }
      ring.seal(in, recv_c);
    } else {
      std::memcpy(ring.chunk_data(recv_c), ring.slot(in), ring.chunk(recv_c));
    }
    ring.wait_send(out, send_c);
  }
}

void reduce_scatter_segmented(const std::shared_ptr<gloo::Context>& context,
                              const RingBuffer& buffer, ReduceFn reduce, uint32_t tag,
                              Millis timeout, RingScratch& scratch) {
  const int n = context->size;
  SegmentedRing ring(context, buffer, kReduceScatterData, kReduceScatterCrc, tag, timeout, scratch);
  const size_t segment = ring.segment_bytes();
  if (scratch.segments.size() < 2 * segment) scratch.segments.resize(2 * segment);
  auto tmp = context->createUnboundBuffer(scratch.segments.data(), 2 * segment);
  const int rank = ring.rank();
  for (int s = 0; s + 1 < n; ++s) {
    const int send_c = wrap(rank - s - 1, n), recv_c = wrap(rank - s - 2, n);
    // What goes out first is this rank's own data; after that, the chunk reduced in the step
    // before, whose CRCs were taken right after reducing each segment, while it was in cache.
    if (s > 0)
      std::copy_n(scratch.next_crcs.begin(), ring.segments(send_c), scratch.sent_crcs.begin());
    ring.expect_crcs(recv_c);
    // Two segments in flight: reduce one while the next arrives.
    const size_t nrecv = ring.segments(recv_c);
    for (size_t i = 0; i < nrecv && i < 2; ++i)
      tmp->recv(ring.prev(), ring.data_slot(), i * segment, ring.length(recv_c, i));
    ring.send_chunk(send_c, s == 0);
    for (size_t i = 0; i < nrecv; ++i) {
      tmp->waitRecv(ring.remaining());
      const uint8_t* arrived = scratch.segments.data() + (i & 1) * segment;
      ring.arrived(recv_c, i, arrived);
      uint8_t* own = ring.at(recv_c, i);
      reduce(own, own, arrived, ring.elements(recv_c, i));
      if (s + 2 < n) scratch.next_crcs[i] = crc32c(own, ring.length(recv_c, i));
      if (i + 2 < nrecv)
        tmp->recv(ring.prev(), ring.data_slot(), (i & 1) * segment, ring.length(recv_c, i + 2));
    }
    ring.verify(recv_c);
    ring.wait_sends(send_c);
  }
}

// Step s of an allgather sends chunk (rank-s) to the next rank and receives chunk (rank-s-1)
// from the previous one. A chunk's CRC is computed once, by its owner, and travels with it.

void allgather_segmented(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                         uint32_t tag, Millis timeout, RingScratch& scratch) {
  const int n = context->size;
  SegmentedRing ring(context, buffer, kAllgatherData, kAllgatherCrc, tag, timeout, scratch);
  const int rank = ring.rank();
  for (int s = 0; s + 1 < n; ++s) {
    const int send_c = wrap(rank - s, n), recv_c = wrap(rank - s - 1, n);
    if (s > 0)
      std::copy_n(scratch.received_crcs.begin(), ring.segments(send_c), scratch.sent_crcs.begin());
    ring.expect_crcs(recv_c);
    const size_t nrecv = ring.segments(recv_c);
    for (size_t i = 0; i < nrecv; ++i)
      ring.data().recv(ring.prev(), ring.data_slot(), ring.offset(recv_c, i),
                       ring.length(recv_c, i));
    ring.send_chunk(send_c, s == 0);
    for (size_t i = 0; i < nrecv; ++i) {
      ring.data().waitRecv(ring.remaining());
      ring.arrived(recv_c, i, ring.at(recv_c, i));
    }
    ring.verify(recv_c);
    ring.wait_sends(send_c);
  }
}

}  // namespace

void check_transfer(int rank, int prev, size_t offset, size_t length, size_t total, uint32_t got,
                    uint32_t sent) {
  if (got == sent) return;
  throw CorruptedTransfer(
      ::dpar::detail::str_cat("the ", length, " bytes rank ", rank, " received from rank ", prev,
                              " (bytes ", offset, "..", offset + length, " of ", total,
                              ") failed their CRC-32C check (", ::dpar::detail::crc_pair(got, sent),
                              "): they were corrupted in transit between the two ranks"));
}

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                         ReduceFn reduce, uint32_t tag, Millis timeout, RingScratch& scratch) {
  const int n = context->size;
  if (n == 1 || total_bytes(buffer) == 0) return;
  if (fits_inline(buffer))
    inline_hops(context, buffer, reduce, n - 1, 0, nullptr, kReduceScatterData, tag, timeout,
                scratch);
  else
    reduce_scatter_segmented(context, buffer, reduce, tag, timeout, scratch);
}

void ring_allgather(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                    uint32_t tag, Millis timeout, RingScratch& scratch) {
  const int n = context->size;
  if (n == 1 || total_bytes(buffer) == 0) return;
  if (fits_inline(buffer))
    inline_hops(context, buffer, nullptr, 0, n - 1, nullptr, kAllgatherData, tag, timeout, scratch);
  else
    allgather_segmented(context, buffer, tag, timeout, scratch);
}

void ring_allreduce(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                    ReduceFn reduce, const ChunkFn& finish, uint32_t tag, Millis timeout,
                    RingScratch& scratch) {
  const int n = context->size;
  if (n == 1 || total_bytes(buffer) == 0) return;
  if (fits_inline(buffer)) {
    // One sequence of hops, so the gather's first receive is posted during the last reduction.
    inline_hops(context, buffer, reduce, n - 1, n - 1, finish, kReduceScatterData, tag, timeout,
                scratch);
    return;
  }
  reduce_scatter_segmented(context, buffer, reduce, tag, timeout, scratch);
  if (finish) {
    RingGeometry geometry(*context, buffer, timeout);
    finish(geometry.chunk_data(geometry.rank()),
           geometry.chunk(geometry.rank()) / buffer.element_size);
  }
  allgather_segmented(context, buffer, tag, timeout, scratch);
}

}  // namespace dpar::dist::detail
