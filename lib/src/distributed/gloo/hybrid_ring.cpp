#include "distributed/gloo/hybrid_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

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
// A chunk up to this size crosses a TCP hop as one message, its CRC behind it.
constexpr size_t kInlineBytes = 64 << 10;

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
  bool inline_chunk(int c) const {
    return buffer.chunk_bytes[static_cast<size_t>(c)] <= kInlineBytes;
  }
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

// The hop to the next rank: its shared-memory link, or Gloo. Over Gloo a chunk of at most
// kInlineBytes is copied to a staging slot with its CRC behind it and goes as one message (a
// second message costs more than the copy); a larger chunk's segments go straight from the
// buffer, each followed by its CRC in a message of its own.
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
    if (scratch.out_stage.size() < kInlineBytes + kCrcBytes)
      scratch.out_stage.resize(kInlineBytes + kCrcBytes);
    stage_bytes_ = scratch.out_stage.data();
    data_ = context->createUnboundBuffer(g.buffer.data, g.offset.back());
    crc_buffer_ = context->createUnboundBuffer(crcs_.data(), crcs_.size() * kCrcBytes);
    stage_ = context->createUnboundBuffer(stage_bytes_, kInlineBytes + kCrcBytes);
  }

  // Segment i of chunk c; what goes straight from the buffer stays untouched until end_step.
  void send(int c, size_t i) {
    const size_t at = g_.at(c, i), length = g_.length(c, i);
    const uint8_t* bytes = g_.buffer.data + at;
    if (link_) {
      link_->send(bytes, length, g_.deadline, g_.timeout, cancelled_);
    } else if (g_.inline_chunk(c)) {
      std::memcpy(stage_bytes_, bytes, length);
      const uint32_t crc = crc32c(bytes, length);
      std::memcpy(stage_bytes_ + length, &crc, kCrcBytes);
      stage_->send(next_, data_slot_, 0, length + kCrcBytes);
      ++staged_;
    } else {
      crcs_[i] = crc32c(bytes, length);
      data_->send(next_, data_slot_, at, length);
      crc_buffer_->send(next_, crc_slot_, i * kCrcBytes, kCrcBytes);
      ++in_flight_;
    }
  }
  void end_step() {
    for (; staged_ > 0; --staged_) stage_->waitSend(g_.remaining());
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
  uint8_t* stage_bytes_ = nullptr;
  std::unique_ptr<gloo::transport::UnboundBuffer> data_, crc_buffer_, stage_;
  size_t in_flight_ = 0, staged_ = 0;
};

// The hop from the previous rank. Over Gloo the segments of the whole collective arrive in a
// known order (`arrivals`), two receives always posted ahead into two staging halves, across
// steps too: Gloo sends a message only once its receiver has announced the receive, so a
// receive posted only when its step starts would add a round trip to every hop. Each segment is
// checked against its CRC before use.
class Incoming {
 public:
  using Arrival = std::pair<int, size_t>;  // chunk, segment

  Incoming(const std::shared_ptr<gloo::Context>& context, ShmLink* link, const Geometry& g,
           std::vector<Arrival> arrivals, uint32_t tag,
           const std::function<std::string()>& cancelled, HybridScratch& scratch)
      : g_(g),
        link_(link),
        cancelled_(cancelled),
        scratch_(scratch),
        arrivals_(std::move(arrivals)),
        rank_(context->rank),
        prev_((context->rank + context->size - 1) % context->size) {
    if (link_) return;
    data_slot_ = gloo::Slot::build(kHybridData, tag);
    crc_slot_ = gloo::Slot::build(kHybridCrc, tag);
    stride_ = (g.segment + kCrcBytes + 63) / 64 * 64;  // halves stay aligned for every dtype
    if (scratch.segments.size() < 2 * stride_) scratch.segments.resize(2 * stride_);
    if (scratch.received_crcs.size() < std::max<size_t>(arrivals_.size(), 1))
      scratch.received_crcs.resize(std::max<size_t>(arrivals_.size(), 1));
    staging_ = context->createUnboundBuffer(scratch.segments.data(), 2 * stride_);
    crc_buffer_ = context->createUnboundBuffer(scratch.received_crcs.data(),
                                               scratch.received_crcs.size() * kCrcBytes);
    for (size_t k = 0; k < arrivals_.size() && k < 2; ++k) post(k);
  }

  // Segment i of chunk c, the next in order, as it arrived (valid until release).
  const uint8_t* receive(int c, size_t i) {
    const size_t length = g_.length(c, i);
    if (link_) return link_->receive(length, g_.deadline, g_.timeout, cancelled_);
    const size_t k = next_++;
    DPAR_CHECK(k < arrivals_.size() && arrivals_[k] == Arrival(c, i), "hybrid ring: segment ", i,
               " of chunk ", c, " is not the one expected");
    staging_->waitRecv(g_.remaining());
    const uint8_t* arrived = scratch_.segments.data() + (k & 1) * stride_;
    uint32_t sent = 0;
    if (g_.inline_chunk(c)) {
      std::memcpy(&sent, arrived + length, kCrcBytes);
    } else {
      crc_buffer_->waitRecv(g_.remaining());
      sent = scratch_.received_crcs[k];
    }
    check_transfer(rank_, prev_, g_.at(c, i), length, g_.offset.back(), crc32c(arrived, length),
                   sent);
    return arrived;
  }
  // The segment last received is used up: its half takes the one two ahead.
  void release() {
    if (link_) {
      link_->release();
    } else if (next_ + 1 < arrivals_.size()) {
      post(next_ + 1);
    }
  }

 private:
  void post(size_t k) {
    const auto [c, i] = arrivals_[k];
    const size_t length = g_.length(c, i);
    if (g_.inline_chunk(c)) {
      staging_->recv(prev_, data_slot_, (k & 1) * stride_, length + kCrcBytes);
    } else {
      staging_->recv(prev_, data_slot_, (k & 1) * stride_, length);
      crc_buffer_->recv(prev_, crc_slot_, k * kCrcBytes, kCrcBytes);
    }
  }

  const Geometry& g_;
  ShmLink* link_;
  const std::function<std::string()>& cancelled_;
  HybridScratch& scratch_;
  const std::vector<Arrival> arrivals_;
  const int rank_, prev_;
  uint64_t data_slot_ = 0, crc_slot_ = 0;
  size_t stride_ = 0, next_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> staging_, crc_buffer_;
};

int wrap(int r, int n) { return (r % n + n) % n; }

// One step of the ring: what this rank sends and receives, and whether it folds what arrives.
struct Step {
  int send_c, recv_c;
  bool reducing;
};

// The ring's reduce-scatter (then `finish`), its allgather, or both.
void hybrid_ring(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                 const RingBuffer& buffer, ReduceFn reduce, const ChunkFn& finish,
                 bool reduce_scatter, bool allgather, uint32_t tag, Millis timeout,
                 const std::function<std::string()>& cancelled, HybridScratch& scratch) {
  const int n = context->size, rank = context->rank;
  const Geometry g(buffer, timeout);
  if (n == 1 || g.offset.back() == 0) return;
  // Reduce-scatter: chunk c starts at rank c+1 and picks up one contribution per hop. Then
  // `finish`, then the allgather: each finished chunk travels on from its owner.
  std::vector<Step> steps;
  if (reduce_scatter) {
    for (int s = 0; s + 1 < n; ++s)
      steps.push_back({wrap(rank - s - 1, n), wrap(rank - s - 2, n), true});
  }
  if (allgather) {
    for (int s = 0; s + 1 < n; ++s)
      steps.push_back({wrap(rank - s, n), wrap(rank - s - 1, n), false});
  }
  std::vector<Incoming::Arrival> arrivals;  // what the TCP hop in posts its receives for
  if (!links.from_prev) {
    for (const Step& step : steps) {
      for (size_t i = 0; i < g.segments(step.recv_c); ++i) arrivals.emplace_back(step.recv_c, i);
    }
  }
  Outgoing out(context, links.to_next.get(), g, tag, cancelled, scratch);
  Incoming in(context, links.from_prev.get(), g, std::move(arrivals), tag, cancelled, scratch);
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& step = steps[k];
    // Segment by segment in lockstep; segment i goes out before segment i comes in, so no hop
    // waits on one that waits on it: a shared-memory send waits only for its consumer to have
    // released segment i-kSlots.
    const size_t ns = g.segments(step.send_c), nr = g.segments(step.recv_c);
    for (size_t i = 0; i < std::max(ns, nr); ++i) {
      if (i < ns) out.send(step.send_c, i);
      if (i >= nr) continue;
      const uint8_t* arrived = in.receive(step.recv_c, i);
      uint8_t* own = buffer.data + g.at(step.recv_c, i);
      if (step.reducing) {
        // own (op) arrived, as every form of the ring folds: the same bits.
        reduce(own, own, arrived, g.length(step.recv_c, i) / buffer.element_size);
      } else {
        std::memcpy(own, arrived, g.length(step.recv_c, i));
      }
      in.release();
    }
    out.end_step();
    if (finish && reduce_scatter && k + 2 == static_cast<size_t>(n)) {  // its last step
      finish(buffer.data + g.at(rank, 0),
             buffer.chunk_bytes[static_cast<size_t>(rank)] / buffer.element_size);
    }
  }
}

}  // namespace

void hybrid_chain_broadcast(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                            uint8_t* data, size_t bytes, int root, uint32_t tag, Millis timeout,
                            const std::function<std::string()>& cancelled, HybridScratch& scratch) {
  const int n = context->size;
  if (n == 1 || bytes == 0) return;
  const RingBuffer buffer{data, {bytes}, 1};
  const Geometry g(buffer, timeout);
  // The chain root, root+1, ..., root-1 along the ring: every rank but the root takes each
  // segment from the rank before it, every rank but the last passes it on.
  const int position = wrap(context->rank - root, n);
  const bool receives = position > 0, sends = position + 1 < n;
  const size_t segments = g.segments(0);
  std::vector<Incoming::Arrival> arrivals;
  if (receives && !links.from_prev) {
    for (size_t i = 0; i < segments; ++i) arrivals.emplace_back(0, i);
  }
  std::optional<Outgoing> out;
  std::optional<Incoming> in;
  if (sends) out.emplace(context, links.to_next.get(), g, tag, cancelled, scratch);
  if (receives) {
    in.emplace(context, links.from_prev.get(), g, std::move(arrivals), tag, cancelled, scratch);
  }
  // Segment by segment, so the chain's ranks work as a pipeline: a segment goes on as soon as
  // it is here, while the next ones are still on their way.
  for (size_t i = 0; i < segments; ++i) {
    if (receives) {
      std::memcpy(data + g.at(0, i), in->receive(0, i), g.length(0, i));
      in->release();
    }
    if (sends) out->send(0, i);
  }
  if (sends) out->end_step();
}

bool chain_broadcast_pays(int size, int shm_hops, size_t bytes) {
  if (shm_hops == 0) return false;
  const int tcp_hops = size - shm_hops;
  const int rounds = std::bit_width(static_cast<unsigned>(size - 1));
  if (bytes <= ShmLink::kSlotBytes) return tcp_hops <= rounds && size - 1 <= 2 * rounds;
  if (tcp_hops <= rounds) return true;
  // bytes + segment * (tcp_hops - 1 + shm_hops / 4) <= rounds * bytes, in whole numbers.
  return 4 * static_cast<double>(bytes) * (rounds - 1) >=
         static_cast<double>(ShmLink::kSlotBytes) * (4 * (tcp_hops - 1) + shm_hops);
}

void hybrid_ring_allreduce(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                           const RingBuffer& buffer, ReduceFn reduce, const ChunkFn& finish,
                           uint32_t tag, Millis timeout,
                           const std::function<std::string()>& cancelled, HybridScratch& scratch) {
  hybrid_ring(context, links, buffer, reduce, finish, true, true, tag, timeout, cancelled, scratch);
}

void hybrid_ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                                const RingBuffer& buffer, ReduceFn reduce, uint32_t tag,
                                Millis timeout, const std::function<std::string()>& cancelled,
                                HybridScratch& scratch) {
  hybrid_ring(context, links, buffer, reduce, nullptr, true, false, tag, timeout, cancelled,
              scratch);
}

void hybrid_ring_allgather(const std::shared_ptr<gloo::Context>& context, RingLinks& links,
                           const RingBuffer& buffer, uint32_t tag, Millis timeout,
                           const std::function<std::string()>& cancelled, HybridScratch& scratch) {
  hybrid_ring(context, links, buffer, nullptr, nullptr, false, true, tag, timeout, cancelled,
              scratch);
}

}  // namespace dpar::dist::detail
