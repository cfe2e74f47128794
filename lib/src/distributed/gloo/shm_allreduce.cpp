#include "distributed/gloo/shm_allreduce.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

// Two cache lines per rank, so a rank's arrivals never share a line with another's.
struct RankControl {
  ShmCounter arrived;  // barriers this rank has reached; its pid
  // What this rank is all-reducing (elements and their size), checked by every rank after the
  // first barrier: over TCP a mismatch fails in the transport, here it would pass silently.
  alignas(64) std::atomic<uint64_t> numel;
  std::atomic<uint32_t> element_size;
};

constexpr size_t kPage = 4096;
constexpr size_t kMaxSegmentBytes = 64 << 20;

size_t control_bytes(int size) {
  return (static_cast<size_t>(size) * sizeof(RankControl) + kPage - 1) / kPage * kPage;
}

RankControl& control(uint8_t* base, int rank) { return reinterpret_cast<RankControl*>(base)[rank]; }

}  // namespace

size_t ShmAllreduce::slot_bytes(int size) {
  const size_t most = kMaxSegmentBytes / (2 * static_cast<size_t>(size)) / kPage * kPage;
  return std::clamp<size_t>(most, 64 << 10, 1 << 20);
}

std::unique_ptr<ShmAllreduce> ShmAllreduce::connect(Store& store, int rank, int size,
                                                    Millis timeout, std::string* why_not) {
  auto refuse = [&](std::string why) {
    if (why_not) *why_not = std::move(why);
    return std::unique_ptr<ShmAllreduce>();
  };
  if (size < 2) return refuse("a world of one");
  auto key = [](const std::string& what, int r) { return "shm/" + what + "/" + std::to_string(r); };
  auto all_keys = [&](const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key(what, r));
    return keys;
  };
  auto text = [](const Bytes& b) { return std::string(b.begin(), b.end()); };
  auto bytes_of = [](const std::string& s) { return Bytes(s.begin(), s.end()); };

  // 1. Rank 0 creates the segment and publishes its name, or why it could not.
  const size_t slot = slot_bytes(size);
  const size_t bytes = control_bytes(size) + 2 * static_cast<size_t>(size) * slot;
  std::string name;
  ShmMapping mapping;
  if (rank == 0) {
    name = new_shm_segment_name("shm");
    mapping = map_shm_segment(name, bytes, /*create=*/true);
    store.set("shm/segment", bytes_of(mapping.base ? name : "!" + mapping.error));
  } else {
    store.wait({"shm/segment"}, timeout);
    name = text(store.get("shm/segment"));
    mapping = name.rfind('!', 0) == 0 ? ShmMapping{nullptr, 0, "rank 0: " + name.substr(1)}
                                      : map_shm_segment(name, bytes, /*create=*/false);
  }
  if (mapping.base) control(mapping.base, rank).arrived.pid.store(static_cast<int32_t>(getpid()));

  // 2. Every rank says whether it mapped it; rank 0 then unlinks the name, so the segment goes
  // away with the last process that maps it, however the job ends.
  store.set(key("mapped", rank), bytes_of(mapping.base ? "" : mapping.error));
  store.wait(all_keys("mapped"), timeout);
  std::string failed;
  for (int r = 0; r < size && failed.empty(); ++r) {
    const std::string error = text(store.get(key("mapped", r)));
    if (!error.empty()) failed = "rank " + std::to_string(r) + " cannot map it: " + error;
  }
  if (rank == 0 && mapping.base) shm_unlink(name.c_str());
  if (!failed.empty()) {
    if (mapping.base) munmap(mapping.base, bytes);
    return refuse("no shared-memory segment: " + failed);
  }
  return std::unique_ptr<ShmAllreduce>(new ShmAllreduce(rank, size, mapping.base, bytes));
}

ShmAllreduce::ShmAllreduce(int rank, int size, uint8_t* base, size_t bytes)
    : rank_(rank), size_(size), base_(base), bytes_(bytes), slot_bytes_(slot_bytes(size)) {
  // Every pid is in the segment once all ranks mapped it.
  for (int r = 0; r < size_; ++r)
    peers_.emplace_back(r == rank_ ? ShmPeer() : ShmPeer(r, control(base_, r).arrived.pid.load()));
}

ShmAllreduce::~ShmAllreduce() { munmap(base_, bytes_); }

uint8_t* ShmAllreduce::slot(int set, int rank) const {
  return base_ + control_bytes(size_) +
         (static_cast<size_t>(set) * static_cast<size_t>(size_) + static_cast<size_t>(rank)) *
             slot_bytes_;
}

void ShmAllreduce::barrier(Millis timeout, const std::function<std::string()>& cancelled) {
  const uint32_t target = ++barriers_;
  shm_advance(control(base_, rank_).arrived, target);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 1; r < size_; ++r) {
    const int peer = (rank_ + r) % size_;
    shm_wait(control(base_, peer).arrived, target, peers_[static_cast<size_t>(peer)], nullptr,
             deadline, timeout, cancelled);
  }
}

void ShmAllreduce::check_same_call(int64_t numel, size_t element_size) const {
  for (int r = 0; r < size_; ++r) {
    const RankControl& c = control(base_, r);
    const uint64_t theirs = c.numel.load();
    const uint32_t their_size = c.element_size.load();
    if (theirs == static_cast<uint64_t>(numel) && their_size == element_size) continue;
    throw ShmFailure("rank " + std::to_string(r) + " all-reduces " + std::to_string(theirs) +
                         " elements of " + std::to_string(their_size) + " bytes, rank " +
                         std::to_string(rank_) + " " + std::to_string(numel) + " of " +
                         std::to_string(element_size) + ": the ranks called different collectives",
                     false);
  }
}

void ShmAllreduce::allreduce(uint8_t* data, const std::vector<int64_t>& bounds, size_t element_size,
                             ReduceFn reduce, const ChunkFn& finish, Millis timeout,
                             const std::function<std::string()>& cancelled) {
  const int n = size_;
  DPAR_CHECK(static_cast<int>(bounds.size()) == n + 1, "shm allreduce: ", bounds.size(),
             " chunk bounds for ", n, " ranks");
  int64_t longest = 0;
  for (int c = 0; c < n; ++c) longest = std::max(longest, bounds[c + 1] - bounds[c]);
  if (longest == 0) return;
  // Elements of each chunk per piece: n of them fill a slot, each starting on a cache line.
  const size_t line_elements = std::max<size_t>(64 / element_size, 1);
  const size_t piece =
      std::max(slot_bytes_ / static_cast<size_t>(n) / element_size / line_elements, size_t{1}) *
      line_elements;
  const size_t piece_bytes = piece * element_size;
  if (fold_.size() < piece_bytes) fold_.resize(piece_bytes);
  auto count = [&](int c, int64_t p) {
    const int64_t left = bounds[c + 1] - bounds[c] - p * static_cast<int64_t>(piece);
    return static_cast<size_t>(std::clamp<int64_t>(left, 0, static_cast<int64_t>(piece)));
  };
  auto at_data = [&](int c, int64_t p) {
    return data + (static_cast<size_t>(bounds[c]) + static_cast<size_t>(p) * piece) * element_size;
  };
  const int64_t pieces = (longest + static_cast<int64_t>(piece) - 1) / static_cast<int64_t>(piece);
  RankControl& mine = control(base_, rank_);
  mine.numel.store(static_cast<uint64_t>(bounds[n]));
  mine.element_size.store(static_cast<uint32_t>(element_size));
  for (int64_t p = 0; p < pieces; ++p) {
    const int set = static_cast<int>(pieces_++ % 2);
    auto at = [&](int r, int c) {
      return slot(set, ((r % n) + n) % n) + static_cast<size_t>(c) * piece_bytes;
    };
    for (int c = 0; c < n; ++c)
      std::memcpy(at(rank_, c), at_data(c, p), count(c, p) * element_size);
    barrier(timeout, cancelled);
    if (p == 0) check_same_call(bounds[n], element_size);
    // This rank's chunk, folded in the ring's order: rank c+1's bytes first, then each next
    // rank's (own) (op) the partial, this rank's last.
    const int c = rank_;
    if (const size_t m = count(c, p); m > 0) {
      if (n == 2) {
        reduce(at(c, c), at(c, c), at(c + 1, c), m);
      } else {
        reduce(fold_.data(), at(c + 2, c), at(c + 1, c), m);
        for (int k = 3; k < n; ++k) reduce(fold_.data(), at(c + k, c), fold_.data(), m);
        reduce(at(c, c), at(c, c), fold_.data(), m);
      }
      if (finish) finish(at(c, c), m);
    }
    barrier(timeout, cancelled);
    for (int o = 0; o < n; ++o) std::memcpy(at_data(o, p), at(o, o), count(o, p) * element_size);
  }
}

}  // namespace dpar::dist::detail
