#include "distributed/gloo/reduce_scatter_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>

namespace dpar::dist::detail {
namespace {

// Gloo's own collectives use slot prefixes 0x01..0x08; this one must not collide with them.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
// Same bound as Gloo's allreduce: large enough to amortise per-message cost, small enough
// that two segments in flight stay in cache.
constexpr size_t kMaxSegmentBytes = 1 << 20;

}  // namespace

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, uint8_t* buffer,
                         const std::vector<size_t>& chunk_bytes, size_t element_size,
                         ReduceFn reduce, uint32_t tag, Millis timeout,
                         std::vector<uint8_t>& scratch) {
  const int n = context->size;
  const int rank = context->rank;
  if (n == 1) return;
  std::vector<size_t> offset(n + 1, 0);
  size_t largest = 0;
  for (int r = 0; r < n; ++r) {
    offset[r + 1] = offset[r] + chunk_bytes[r];
    largest = std::max(largest, chunk_bytes[r]);
  }
  if (offset[n] == 0) return;
  const size_t segment = std::min(largest, kMaxSegmentBytes / element_size * element_size);
  if (scratch.size() < 2 * segment) scratch.resize(2 * segment);

  auto data = context->createUnboundBuffer(buffer, offset[n]);
  auto tmp = context->createUnboundBuffer(scratch.data(), 2 * segment);
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  const int next = (rank + 1) % n;
  const int prev = (rank + n - 1) % n;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto remaining = [&] {
    auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    return std::max(left, Millis(1));
  };
  auto segment_len = [&](int chunk, size_t i) {
    return std::min(segment, chunk_bytes[chunk] - i * segment);
  };
  auto segments = [&](int chunk) { return (chunk_bytes[chunk] + segment - 1) / segment; };

  // Step s: send chunk (rank-s-1) to the next rank and reduce chunk (rank-s-2) received from
  // the previous one. Chunk c starts at rank c+1 and picks up one contribution per hop, so
  // after n-1 steps this rank holds chunk `rank` reduced over all ranks.
  for (int s = 0; s + 1 < n; ++s) {
    const int send_chunk = ((rank - s - 1) % n + n) % n;
    const int recv_chunk = ((rank - s - 2) % n + n) % n;
    const size_t nsend = segments(send_chunk);
    for (size_t i = 0; i < nsend; ++i) {
      data->send(next, slot, offset[send_chunk] + i * segment, segment_len(send_chunk, i));
    }
    // Two segments in flight: reduce one while the next arrives.
    const size_t nrecv = segments(recv_chunk);
    for (size_t i = 0; i < nrecv && i < 2; ++i) {
      tmp->recv(prev, slot, i * segment, segment_len(recv_chunk, i));
    }
    for (size_t i = 0; i < nrecv; ++i) {
      tmp->waitRecv(remaining());
      const size_t len = segment_len(recv_chunk, i);
      uint8_t* dst = buffer + offset[recv_chunk] + i * segment;
      reduce(dst, dst, scratch.data() + (i & 1) * segment, len / element_size);
      if (i + 2 < nrecv) tmp->recv(prev, slot, (i & 1) * segment, segment_len(recv_chunk, i + 2));
    }
    for (size_t i = 0; i < nsend; ++i) data->waitSend(remaining());
  }
}

}  // namespace dpar::dist::detail
