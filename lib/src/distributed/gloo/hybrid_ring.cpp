#include "distributed/gloo/hybrid_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>

#include "core/crc32c.h"
#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

using dpar::detail::crc32c;
using Clock = std::chrono::steady_clock;

// Slot prefixes of their own (checked_ring.cpp uses 0x40..0x44, the mesh handshake 0x41).
constexpr uint8_t kHybridData = 0x45;
constexpr uint8_t kHybridCrc = 0x46;
constexpr size_t kCrcBytes = sizeof(uint32_t);

// The chunks and their segments; a segment fits a shared-memory slot, and both ends of every
// hop cut a chunk alike.
struct Geometry {
  Geometry(const RingBuffer& buffer, Millis timeout)
      : buffer(buffer),
        segment(std::max<size_t>(ShmLink::kSlotBytes / buffer.element_size, 1) *
                buffer.element_size),
        offset(buffer.chunk_bytes.size() + 1, 0),
        deadline(Clock::now() + timeout),
        timeout(timeout) {
    for (size_t c = 0; c < buffer.chunk_bytes.size(); ++c)
      offset[c + 1] = offset[c] + buffer.chunk_bytes[c];
  }
  size_t segments(int c) const {
    return (buffer.chunk_bytes[static_cast<size_t>(c)] + segment - 1) / segment;
  }
  size_t length(int c, size_t i) const {
    return std::min(segment, buffer.chunk_bytes[static_cast<size_t>(c)] - i * segment);
  }
  size_t at(int c, size_t i) const { return offset[static_cast<size_t>(c)] + i * segment; }
  size_t most_segments() const {
    size_t most = 1;
    for (int c = 0; c + 1 < static_cast<int>(offset.size()); ++c)
      most = std::max(most, segments(c));
    return most;
  }
  Millis remaining() const {
    return std::max(std::chrono::duration_cast<Millis>(deadline - Clock::now()), Millis(1));
  }

  const RingBuffer& buffer;
  const size_t segment;
  std::vector<size_t> offset;
  const Clock::time_point deadline;
  const Millis timeout;
};

// The hop to the next rank: its shared-memory link, or Gloo with each segment's CRC behind it.
class Outgoing {
 public:
  Outgoing(const std::shared_ptr<gloo::Context>& context, ShmLink* link, const Geometry& g,
           uint32_t tag, const std::function<std::string()>& cancelled, HybridScratch& scratch)
      : g_(g), link_(link), cancelled_(cancelled), crcs_(scratch.sent_crcs) {
    if (link_) return;
    next_ = (context->rank + 1) % context->size;
    data_slot_ = gloo::Slot::build(kHybridData, tag);
    crc_slot_ = gloo::Slot::build(kHybridCrc, tag);
    if (crcs_.size() < g.most_segments()) crcs_.resize(g.most_segments());
    data_ = context->createUnboundBuffer(g.buffer.data, g.offset.back());
    crc_buffer_ = context->createUnboundBuffer(crcs_.data(), crcs_.size() * kCrcBytes);
  }

  // Segment i of chunk c. Over TCP the bytes go straight from the buffer (left untouched until
  // end_step); through shared memory they are copied into a slot.
  void send(int c, size_t i) {
    const size_t at = g_.at(c, i), length = g_.length(c, i);
    if (link_) {
      link_->send(g_.buffer.data + at, length, g_.deadline, g_.timeout, cancelled_);
      return;
    }
    crcs_[i] = crc32c(g_.buffer.data + at, length);
    data_->send(next_, data_slot_, at, length);
    crc_buffer_->send(next_, crc_slot_, i * kCrcBytes, kCrcBytes);
    ++in_flight_;
  }
  void end_step() {
    for (; in_flight_ > 0; --in_flight_) {
      data_->waitSend(g_.remaining());
      crc_buffer_->waitSend(g_.remaining());
    }
  }

 private:
  const Geometry& g_;
  ShmLink* link_;
  const std::function<std::string()>& cancelled_;
  std::vector<uint32_t>& crcs_;
  int next_ = 0;
  uint64_t data_slot_ = 0, crc_slot_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> data_, crc_buffer_;
  size_t in_flight_ = 0;
};

// The hop from the previous rank. Over TCP two segments are in flight into two staging halves,
// so one is reduced while the next arrives; each is checked against its CRC before use.
class Incoming {
 public:
  Incoming(const std::shared_ptr<gloo::Context>& context, ShmLink* link, const Geometry& g,
           uint32_t tag, const std::function<std::string()>& cancelled, HybridScratch& scratch)
      : g_(g), link_(link), cancelled_(cancelled), scratch_(scratch), rank_(context->rank) {
    prev_ = (context->rank + context->size - 1) % context->size;
    if (link_) return;
    data_slot_ = gloo::Slot::build(kHybridData, tag);
    crc_slot_ = gloo::Slot::build(kHybridCrc, tag);
    if (scratch.segments.size() < 2 * g.segment) scratch.segments.resize(2 * g.segment);
    if (scratch.received_crcs.size() < g.most_segments())
      scratch.received_crcs.resize(g.most_segments());
    staging_ = context->createUnboundBuffer(scratch.segments.data(), 2 * g.segment);
    crc_buffer_ = context->createUnboundBuffer(scratch.received_crcs.data(),
                                               scratch.received_crcs.size() * kCrcBytes);
  }

  void begin_step(int c) {
    c_ = c;
    if (link_) return;
    const size_t n = g_.segments(c);
    for (size_t i = 0; i < n; ++i) crc_buffer_->recv(prev_, crc_slot_, i * kCrcBytes, kCrcBytes);
    for (size_t i = 0; i < n && i < 2; ++i) post(i);
  }
  // Segment i of this step's chunk, as it arrived (valid until release).
  const uint8_t* receive(size_t i) {
    const size_t length = g_.length(c_, i);
    if (link_) return link_->receive(length, g_.deadline, g_.timeout, cancelled_);
    staging_->waitRecv(g_.remaining());
    crc_buffer_->waitRecv(g_.remaining());
    const uint8_t* arrived = scratch_.segments.data() + (i & 1) * g_.segment;
    const uint32_t got = crc32c(arrived, length), sent = scratch_.received_crcs[i];
    if (got != sent) {
      const size_t at = g_.at(c_, i);
      throw CorruptedTransfer(::dpar::detail::str_cat(
          "the ", length, " bytes rank ", rank_, " received from rank ", prev_, " (bytes ", at,
          "..", at + length, " of ", g_.offset.back(), ") failed their CRC-32C check (",
          ::dpar::detail::crc_pair(got, sent),
          "): they were corrupted in transit between the two ranks"));
    }
    return arrived;
  }
  void release(size_t i) {
    if (link_) {
      link_->release();
    } else if (i + 2 < g_.segments(c_)) {
      post(i + 2);
    }
  }

 private:
  void post(size_t i) { staging_->recv(prev_, data_slot_, (i & 1) * g_.segment, g_.length(c_, i)); }

  const Geometry& g_;
  ShmLink* link_;
  const std::function<std::string()>& cancelled_;
  HybridScratch& scratch_;
  int rank_, prev_ = 0, c_ = 0;
  uint64_t data_slot_ = 0, crc_slot_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> staging_, crc_buffer_;
};

int wrap(int r, int n) { return (r % n + n) % n; }

}  // namespace

void hybrid_ring_allreduce(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                           const RingBuffer& buffer, ReduceFn reduce, const ChunkFn& finish,
                           uint32_t tag, Millis timeout,
                           const std::function<std::string()>& cancelled, HybridScratch& scratch) {
  const int n = context->size, rank = context->rank;
  const Geometry g(buffer, timeout);
  if (n == 1 || g.offset.back() == 0) return;
  Outgoing out(context, links.to_next.get(), g, tag, cancelled, scratch);
  Incoming in(context, links.from_prev.get(), g, tag, cancelled, scratch);
  // One step: send chunk send_c, receive chunk recv_c, segment by segment in lockstep. Segment i
  // goes out before segment i comes in, so no hop waits on one that waits on it: a shared-memory
  // send waits only for its consumer to have released segment i-kSlots.
  auto step = [&](int send_c, int recv_c, bool reducing) {
    in.begin_step(recv_c);
    const size_t ns = g.segments(send_c), nr = g.segments(recv_c);
    for (size_t i = 0; i < std::max(ns, nr); ++i) {
      if (i < ns) out.send(send_c, i);
      if (i >= nr) continue;
      const uint8_t* arrived = in.receive(i);
      uint8_t* own = buffer.data + g.at(recv_c, i);
      if (reducing) {
        // own (op) arrived, as every form of the ring folds: the same bits.
        reduce(own, own, arrived, g.length(recv_c, i) / buffer.element_size);
      } else {
        std::memcpy(own, arrived, g.length(recv_c, i));
      }
      in.release(i);
    }
    out.end_step();
  };
  // Reduce-scatter: chunk c starts at rank c+1 and picks up one contribution per hop.
  for (int s = 0; s + 1 < n; ++s) step(wrap(rank - s - 1, n), wrap(rank - s - 2, n), true);
  if (finish) {
    finish(buffer.data + g.at(rank, 0),
           buffer.chunk_bytes[static_cast<size_t>(rank)] / buffer.element_size);
  }
  // Allgather: each finished chunk travels on from its owner.
  for (int s = 0; s + 1 < n; ++s) step(wrap(rank - s, n), wrap(rank - s - 1, n), false);
}

}  // namespace dpar::dist::detail
