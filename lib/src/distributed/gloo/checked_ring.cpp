#include "distributed/gloo/checked_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/crc32c.h"
#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

// Slot prefixes: Gloo's own collectives use 0x01..0x08 and the mesh handshake 0x41. A chunk's
// CRCs travel as one message behind its segments, on a slot of their own.
constexpr uint8_t kReduceScatterData = 0x40;
constexpr uint8_t kReduceScatterCrc = 0x42;
constexpr uint8_t kAllgatherData = 0x43;
constexpr uint8_t kAllgatherCrc = 0x44;
// Same bound as Gloo's allreduce: large enough to amortise per-message cost, small enough that
// two segments in flight stay in cache.
constexpr size_t kMaxSegmentBytes = 1 << 20;

std::string hex32(uint32_t v) {
  char text[12];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

// The geometry and the Gloo buffers of one ring collective over `buffer`; the steps are the
// callers'. Chunks are cut into segments of at most kMaxSegmentBytes.
class Ring {
 public:
  Ring(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer, uint8_t data_prefix,
       uint8_t crc_prefix, uint32_t tag, Millis timeout, RingScratch& scratch)
      : rank_(context->rank),
        size_(context->size),
        next_((rank_ + 1) % size_),
        prev_((rank_ + size_ - 1) % size_),
        buffer_(buffer),
        offset_(static_cast<size_t>(size_) + 1, 0),
        data_slot_(gloo::Slot::build(data_prefix, tag)),
        crc_slot_(gloo::Slot::build(crc_prefix, tag)),
        deadline_(std::chrono::steady_clock::now() + timeout),
        scratch_(scratch) {
    size_t largest = 0;
    for (int r = 0; r < size_; ++r) {
      offset_[r + 1] = offset_[r] + chunk(r);
      largest = std::max(largest, chunk(r));
    }
    const size_t whole_elements = kMaxSegmentBytes / buffer.element_size * buffer.element_size;
    segment_ = std::max<size_t>(std::min(largest, whole_elements), 1);
    const size_t most = std::max<size_t>((largest + segment_ - 1) / segment_, 1);
    for (auto* v :
         {&scratch.sent_crcs, &scratch.received_crcs, &scratch.next_crcs, &scratch.arrived_crcs}) {
      if (v->size() < most) v->resize(most);
    }
    data_ = context->createUnboundBuffer(buffer.data, offset_[static_cast<size_t>(size_)]);
    sent_ = context->createUnboundBuffer(scratch.sent_crcs.data(), most * sizeof(uint32_t));
    received_ = context->createUnboundBuffer(scratch.received_crcs.data(), most * sizeof(uint32_t));
  }

  int rank() const { return rank_; }
  int prev() const { return prev_; }
  size_t segment_bytes() const { return segment_; }
  size_t segments(int c) const { return (chunk(c) + segment_ - 1) / segment_; }
  size_t length(int c, size_t i) const { return std::min(segment_, chunk(c) - i * segment_); }
  size_t elements(int c, size_t i) const { return length(c, i) / buffer_.element_size; }
  size_t offset(int c, size_t i) const { return offset_[static_cast<size_t>(c)] + i * segment_; }
  uint8_t* at(int c, size_t i) const { return buffer_.data + offset(c, i); }
  uint64_t data_slot() const { return data_slot_; }
  gloo::transport::UnboundBuffer& data() { return *data_; }
  Millis remaining() const {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline_ - std::chrono::steady_clock::now());
    return std::max(left, Millis(1));
  }

  // Sends chunk c's segments to the next rank, then their CRCs in one message: taken here from
  // this rank's bytes (`own`, just before each segment goes, so the first leaves at once), or
  // already in scratch.sent_crcs.
  void send_chunk(int c, bool own) {
    const size_t n = segments(c);
    for (size_t i = 0; i < n; ++i) {
      if (own) scratch_.sent_crcs[i] = dpar::detail::crc32c(at(c, i), length(c, i));
      data_->send(next_, data_slot_, offset(c, i), length(c, i));
    }
    if (n > 0) sent_->send(next_, crc_slot_, 0, n * sizeof(uint32_t));
  }
  void wait_sends(int c) {
    const size_t n = segments(c);
    for (size_t i = 0; i < n; ++i) data_->waitSend(remaining());
    if (n > 0) sent_->waitSend(remaining());
  }

  // Posts the receive of chunk c's CRCs (into scratch.received_crcs).
  void expect_crcs(int c) {
    const size_t n = segments(c);
    if (n > 0) received_->recv(prev_, crc_slot_, 0, n * sizeof(uint32_t));
  }

  // Takes the CRC of segment i of chunk c as it arrived, before anything is done with it.
  void arrived(int c, size_t i, const uint8_t* bytes) {
    scratch_.arrived_crcs[i] = dpar::detail::crc32c(bytes, length(c, i));
  }

  // Waits for the sender's CRCs of chunk c and compares them with what arrived. Runs before the
  // step ends, so nothing that failed it is sent on or handed to the caller.
  void verify(int c) {
    const size_t n = segments(c);
    if (n == 0) return;
    received_->waitRecv(remaining());
    for (size_t i = 0; i < n; ++i) {
      const uint32_t got = scratch_.arrived_crcs[i];
      const uint32_t sent = scratch_.received_crcs[i];
      if (got == sent) continue;
      throw CorruptedTransfer(::dpar::detail::str_cat(
          "the ", length(c, i), " bytes rank ", rank_, " received from rank ", prev_, " (bytes ",
          offset(c, i), "..", offset(c, i) + length(c, i), " of ", offset_.back(),
          ") failed their CRC-32C check (", hex32(got), " != ", hex32(sent),
          "): they were corrupted in transit between the two ranks"));
    }
  }

 private:
  size_t chunk(int r) const { return buffer_.chunk_bytes[static_cast<size_t>(r)]; }

  const int rank_, size_, next_, prev_;
  const RingBuffer& buffer_;
  std::vector<size_t> offset_;
  size_t segment_ = 1;
  const uint64_t data_slot_, crc_slot_;
  const std::chrono::steady_clock::time_point deadline_;
  RingScratch& scratch_;
  std::unique_ptr<gloo::transport::UnboundBuffer> data_, sent_, received_;
};

size_t total_bytes(const RingBuffer& buffer) {
  size_t total = 0;
  for (size_t b : buffer.chunk_bytes) total += b;
  return total;
}

}  // namespace

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                         ReduceFn reduce, uint32_t tag, Millis timeout, RingScratch& scratch) {
  const int n = context->size;
  if (n == 1 || total_bytes(buffer) == 0) return;
  Ring ring(context, buffer, kReduceScatterData, kReduceScatterCrc, tag, timeout, scratch);
  const size_t segment = ring.segment_bytes();
  if (scratch.segments.size() < 2 * segment) scratch.segments.resize(2 * segment);
  auto tmp = context->createUnboundBuffer(scratch.segments.data(), 2 * segment);
  const int rank = ring.rank();

  // Step s: send chunk (rank-s-1) to the next rank and reduce chunk (rank-s-2) received from
  // the previous one. Chunk c starts at rank c+1 and picks up one contribution per hop, so
  // after n-1 steps this rank holds chunk `rank` reduced over all ranks.
  for (int s = 0; s + 1 < n; ++s) {
    const int send_chunk = ((rank - s - 1) % n + n) % n;
    const int recv_chunk = ((rank - s - 2) % n + n) % n;
    // What goes out first is this rank's own data; after that, the chunk reduced in the step
    // before, whose CRCs were taken right after reducing each segment, while it was in cache.
    if (s > 0) {
      std::copy_n(scratch.next_crcs.begin(), ring.segments(send_chunk), scratch.sent_crcs.begin());
    }
    ring.expect_crcs(recv_chunk);
    // Two segments in flight: reduce one while the next arrives.
    const size_t nrecv = ring.segments(recv_chunk);
    for (size_t i = 0; i < nrecv && i < 2; ++i) {
      tmp->recv(ring.prev(), ring.data_slot(), i * segment, ring.length(recv_chunk, i));
    }
    ring.send_chunk(send_chunk, s == 0);
    for (size_t i = 0; i < nrecv; ++i) {
      tmp->waitRecv(ring.remaining());
      const uint8_t* in = scratch.segments.data() + (i & 1) * segment;
      ring.arrived(recv_chunk, i, in);
      uint8_t* dst = ring.at(recv_chunk, i);
      reduce(dst, dst, in, ring.elements(recv_chunk, i));
      if (s + 2 < n) scratch.next_crcs[i] = dpar::detail::crc32c(dst, ring.length(recv_chunk, i));
      if (i + 2 < nrecv) {
        tmp->recv(ring.prev(), ring.data_slot(), (i & 1) * segment, ring.length(recv_chunk, i + 2));
      }
    }
    ring.verify(recv_chunk);
    ring.wait_sends(send_chunk);
  }
}

void ring_allgather(const std::shared_ptr<gloo::Context>& context, const RingBuffer& buffer,
                    uint32_t tag, Millis timeout, RingScratch& scratch) {
  const int n = context->size;
  if (n == 1 || total_bytes(buffer) == 0) return;
  Ring ring(context, buffer, kAllgatherData, kAllgatherCrc, tag, timeout, scratch);
  const int rank = ring.rank();

  // Step s: send chunk (rank-s) to the next rank and receive chunk (rank-s-1) from the previous
  // one, in place. A chunk's CRCs are computed once, by its owner, and travel with it.
  for (int s = 0; s + 1 < n; ++s) {
    const int send_chunk = ((rank - s) % n + n) % n;
    const int recv_chunk = ((rank - s - 1) % n + n) % n;
    if (s > 0) {
      std::copy_n(scratch.received_crcs.begin(), ring.segments(send_chunk),
                  scratch.sent_crcs.begin());
    }
    ring.expect_crcs(recv_chunk);
    const size_t nrecv = ring.segments(recv_chunk);
    for (size_t i = 0; i < nrecv; ++i) {
      ring.data().recv(ring.prev(), ring.data_slot(), ring.offset(recv_chunk, i),
                       ring.length(recv_chunk, i));
    }
    ring.send_chunk(send_chunk, s == 0);
    for (size_t i = 0; i < nrecv; ++i) {
      ring.data().waitRecv(ring.remaining());
      ring.arrived(recv_chunk, i, ring.at(recv_chunk, i));
    }
    ring.verify(recv_chunk);
    ring.wait_sends(send_chunk);
  }
}

}  // namespace dpar::dist::detail
