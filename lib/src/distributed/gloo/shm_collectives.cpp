#include "distributed/gloo/shm_collectives.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMaxSegmentBytes = 64 << 20;
constexpr size_t kHeaderBytes = 512;
constexpr int kListedChunks = 8;

// The segment's first block: the rank that gave up on the group first, and why. The others'
// waits read it, so they fail at once with that reason instead of waiting out the timeout for a
// rank that will not come (over TCP its closed sockets tell them).
struct FailureBlock {
  std::atomic<uint32_t> rank_plus_one;  // 0: no rank gave up
  std::atomic<uint32_t> written;        // the reason is complete
  char reason[kHeaderBytes - 2 * sizeof(uint32_t)];
};
static_assert(sizeof(FailureBlock) == kHeaderBytes);

// What a rank is calling, checked by every rank after the call's first barrier: over TCP a
// mismatch fails in the transport (or the DETAIL check), here it would pass silently.
struct CallRecord {
  std::atomic<uint32_t> kind;
  std::atomic<int32_t> dtype;  // -1: bytes (broadcast, barrier)
  std::atomic<int32_t> op;     // -1: no reduction
  std::atomic<int32_t> root;
  std::atomic<uint64_t> bytes;
  std::atomic<uint64_t> split_hash;             // of every chunk's size (uneven chunks)
  std::atomic<uint32_t> chunks;                 // 0: not given in chunks
  std::atomic<uint64_t> listed[kListedChunks];  // the first chunks' elements, for the message
};

// Two cache lines and more per rank, so a rank's arrivals never share a line with another's.
struct RankControl {
  ShmCounter arrived;  // barriers this rank has reached; its pid
  // By the parity of the call: a rank that finished a call (one barrier per piece) may already
  // publish its next while a slower one still checks this one, but never the one after.
  alignas(64) CallRecord calls[2];
};

// Of `total` units cut into pieces of `piece`, how many piece p holds (0 past the end).
size_t piece_length(size_t total, size_t piece, size_t p) {
  return std::min(piece, total - std::min(total, p * piece));
}

size_t control_bytes(int size) {
  return (kHeaderBytes + static_cast<size_t>(size) * sizeof(RankControl) + kPage - 1) / kPage *
         kPage;
}

FailureBlock& failure(uint8_t* base) { return *reinterpret_cast<FailureBlock*>(base); }

RankControl& control(uint8_t* base, int rank) {
  return reinterpret_cast<RankControl*>(base + kHeaderBytes)[rank];
}

}  // namespace

size_t ShmCollectives::slot_bytes(int size) {
  const size_t most = kMaxSegmentBytes / (2 * static_cast<size_t>(size)) / kPage * kPage;
  return std::clamp<size_t>(most, 64 << 10, 1 << 20);
}

std::unique_ptr<ShmCollectives> ShmCollectives::connect(Store& store, int rank, int size,
                                                        Millis timeout, std::string* why_not) {
  auto refuse = [&](std::string why) {
    if (why_not) *why_not = std::move(why);
    return std::unique_ptr<ShmCollectives>();
  };
  if (size < 2) return refuse("a world of one");
  // A piece of each chunk starts on a cache line, so n ranks' pieces need n lines of a slot.
  if (static_cast<size_t>(size) * 64 > slot_bytes(size))
    return refuse(std::to_string(size) + " ranks on one host (at most 1024)");
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
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(rank, size, mapping.base, bytes));
}

ShmCollectives::ShmCollectives(int rank, int size, uint8_t* base, size_t bytes)
    : rank_(rank), size_(size), base_(base), bytes_(bytes), slot_bytes_(slot_bytes(size)) {
  // Every pid is in the segment once all ranks mapped it.
  for (int r = 0; r < size_; ++r)
    peers_.emplace_back(r == rank_ ? ShmPeer() : ShmPeer(r, control(base_, r).arrived.pid.load()));
}

ShmCollectives::~ShmCollectives() { munmap(base_, bytes_); }

uint8_t* ShmCollectives::slot(int set, int rank) const {
  return base_ + control_bytes(size_) +
         (static_cast<size_t>(set) * static_cast<size_t>(size_) + static_cast<size_t>(rank)) *
             slot_bytes_;
}

void ShmCollectives::wait_for_all(Millis timeout, const Cancelled& cancelled) {
  const uint32_t target = ++barriers_;
  shm_advance(control(base_, rank_).arrived, target);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 1; r < size_; ++r) {
    const int peer = (rank_ + r) % size_;
    shm_wait(
        control(base_, peer).arrived, target, peers_[static_cast<size_t>(peer)],
        [this] { return peer_gave_up(); }, deadline, timeout, cancelled);
  }
}

void ShmCollectives::begin_call(const Call& call) {
  CallRecord& r = control(base_, rank_).calls[calls_ % 2];
  r.kind.store(static_cast<uint32_t>(call.kind));
  r.dtype.store(call.dtype ? static_cast<int32_t>(*call.dtype) : -1);
  r.op.store(call.op ? static_cast<int32_t>(*call.op) : -1);
  r.root.store(call.root);
  r.bytes.store(call.bytes);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a over the chunk sizes
  const size_t chunks = call.chunk_bytes ? call.chunk_bytes->size() : 0;
  const size_t element_size = call.dtype ? dtype_size(*call.dtype) : 1;
  for (size_t c = 0; c < chunks; ++c) {
    const uint64_t b = (*call.chunk_bytes)[c];
    hash = (hash ^ b) * 1099511628211ull;
    if (c < kListedChunks) r.listed[c].store(b / element_size);
  }
  r.split_hash.store(hash);
  r.chunks.store(static_cast<uint32_t>(chunks));
}

namespace {

std::string describe(const CallRecord& r) {
  const uint64_t bytes = r.bytes.load();
  const int32_t dtype = r.dtype.load(), op = r.op.load();
  std::string what = dtype < 0
                         ? std::to_string(bytes) + " bytes"
                         : std::to_string(bytes / dtype_size(static_cast<DType>(dtype))) +
                               " elements of " + std::string(dtype_name(static_cast<DType>(dtype)));
  if (op >= 0) what += std::string(" (") + reduce_op_name(static_cast<ReduceOp>(op)) + ")";
  if (const uint32_t chunks = r.chunks.load(); chunks > 0) {
    what += " in chunks of [";
    for (uint32_t c = 0; c < chunks && c < kListedChunks; ++c)
      what += (c ? ", " : "") + std::to_string(r.listed[c].load());
    what += chunks > kListedChunks ? ", ... (" + std::to_string(chunks) + " chunks)]" : "]";
  }
  using Kind = ShmCollectives::Kind;
  switch (static_cast<Kind>(r.kind.load())) {
    case Kind::allreduce:
      return "all-reduces " + what;
    case Kind::reduce_scatter:
      return "reduce-scatters " + what;
    case Kind::allgather:
      return "all-gathers " + what;
    case Kind::broadcast:
      return "broadcasts " + what + " from rank " + std::to_string(r.root.load());
    case Kind::barrier:
      return "waits at a barrier";
  }
  return "calls collective " + std::to_string(r.kind.load());
}

bool same_call(const CallRecord& a, const CallRecord& b) {
  return a.kind.load() == b.kind.load() && a.dtype.load() == b.dtype.load() &&
         a.op.load() == b.op.load() && a.root.load() == b.root.load() &&
         a.bytes.load() == b.bytes.load() && a.chunks.load() == b.chunks.load() &&
         a.split_hash.load() == b.split_hash.load();
}

}  // namespace

void ShmCollectives::check_call() const {
  const CallRecord& mine = control(base_, rank_).calls[calls_ % 2];
  for (int r = 0; r < size_; ++r) {
    const CallRecord& theirs = control(base_, r).calls[calls_ % 2];
    if (same_call(theirs, mine)) continue;
    throw ShmFailure("rank " + std::to_string(r) + " " + describe(theirs) + ", rank " +
                         std::to_string(rank_) + " " + describe(mine) +
                         ": the ranks called different collectives",
                     false);
  }
}

void ShmCollectives::give_up(const std::string& why) {
  FailureBlock& f = failure(base_);
  uint32_t none = 0;
  if (f.rank_plus_one.compare_exchange_strong(none, static_cast<uint32_t>(rank_ + 1))) {
    const size_t n = std::min(why.size(), sizeof f.reason - 1);
    std::memcpy(f.reason, why.data(), n);
    f.reason[n] = '\0';
    f.written.store(1);
  }
  // Waiters asleep on any rank's counter look again.
  for (int r = 0; r < size_; ++r) shm_wake(control(base_, r).arrived);
}

std::string ShmCollectives::peer_gave_up() const {
  const FailureBlock& f = failure(base_);
  const uint32_t who = f.rank_plus_one.load();
  if (who == 0 || who == static_cast<uint32_t>(rank_ + 1)) return {};
  std::string line = "rank " + std::to_string(who - 1) + " gave up on the collective";
  if (f.written.load()) line += std::string(": ") + f.reason;
  return line;
}

void ShmCollectives::fold_pieces(const Fold& f, Millis timeout, const Cancelled& cancelled) {
  const int n = size_;
  const size_t es = f.element_size;
  size_t longest = 0;
  for (size_t b : f.chunk_bytes) longest = std::max(longest, b);
  // Elements of each chunk per piece: n of them fill a slot, each starting on a cache line.
  const size_t line_elements = std::max<size_t>(64 / es, 1);
  const size_t piece =
      std::max(slot_bytes_ / static_cast<size_t>(n) / es / line_elements, size_t{1}) *
      line_elements;
  const size_t piece_bytes = piece * es;
  if (fold_.size() < piece_bytes) fold_.resize(piece_bytes);
  auto count = [&](int c, size_t p) {  // elements of chunk c in piece p
    return piece_length(f.chunk_bytes[static_cast<size_t>(c)] / es, piece, p);
  };
  // At least one piece: ranks that pass nothing still meet and check each other's call.
  const size_t pieces = std::max<size_t>((longest + piece_bytes - 1) / piece_bytes, 1);
  for (size_t p = 0; p < pieces; ++p) {
    const int set = next_set();
    auto at = [&](int r, int c) {
      return slot(set, ((r % n) + n) % n) + static_cast<size_t>(c) * piece_bytes;
    };
    // The chunks the other ranks fold; this rank's own is read where it is (no other rank reads
    // it), which saves copying it in.
    for (int c = 0; c < n; ++c) {
      if (c == rank_) continue;
      if (const size_t m = count(c, p))
        std::memcpy(at(rank_, c), f.chunks[static_cast<size_t>(c)] + p * piece_bytes, m * es);
    }
    wait_for_all(timeout, cancelled);
    if (p == 0) check_call();
    // This rank's chunk, folded in the ring's order: rank c+1's bytes first, then each next
    // rank's (own) (op) the partial, this rank's last.
    const int c = rank_;
    if (const size_t m = count(c, p); m > 0) {
      const uint8_t* own = f.chunks[static_cast<size_t>(c)] + p * piece_bytes;
      uint8_t* result = f.out_own ? f.out_own + p * piece_bytes : at(c, c);
      if (n == 2) {
        f.reduce(result, own, at(c + 1, c), m);
      } else {
        // The partial may build up in the output, unless that is this rank's own input (a
        // reduce_scatter into its own chunk), read last.
        uint8_t* partial = result == own ? fold_.data() : result;
        f.reduce(partial, at(c + 2, c), at(c + 1, c), m);
        for (int k = 3; k < n; ++k) f.reduce(partial, at(c + k, c), partial, m);
        f.reduce(result, own, partial, m);
      }
      if (f.finish) f.finish(result, m);
    }
    if (!f.copy_out) continue;
    wait_for_all(timeout, cancelled);
    for (int o = 0; o < n; ++o) {
      if (const size_t m = count(o, p))
        std::memcpy((*f.copy_out)[static_cast<size_t>(o)] + p * piece_bytes, at(o, o), m * es);
    }
  }
}

void ShmCollectives::allreduce(uint8_t* data, const std::vector<int64_t>& bounds, DType dtype,
                               ReduceOp op, ReduceFn reduce, const ChunkFn& finish, Millis timeout,
                               const Cancelled& cancelled) {
  const int n = size_;
  const size_t element_size = dtype_size(dtype);
  DPAR_CHECK(static_cast<int>(bounds.size()) == n + 1, "shm allreduce: ", bounds.size(),
             " chunk bounds for ", n, " ranks");
  std::vector<const uint8_t*> chunks(static_cast<size_t>(n));
  std::vector<uint8_t*> outputs(static_cast<size_t>(n));
  std::vector<size_t> chunk_bytes(static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) {
    outputs[c] = data + static_cast<size_t>(bounds[c]) * element_size;
    chunks[c] = outputs[c];
    chunk_bytes[c] = static_cast<size_t>(bounds[c + 1] - bounds[c]) * element_size;
  }
  begin_call(
      {Kind::allreduce, dtype, op, 0, static_cast<uint64_t>(bounds[n]) * element_size, nullptr});
  fold_pieces({chunks, chunk_bytes, element_size, reduce, finish, nullptr, &outputs}, timeout,
              cancelled);
  ++calls_;
}

void ShmCollectives::reduce_scatter(const std::vector<const uint8_t*>& chunks,
                                    const std::vector<size_t>& chunk_bytes, uint8_t* out,
                                    DType dtype, ReduceOp op, ReduceFn reduce,
                                    const ChunkFn& finish, Millis timeout,
                                    const Cancelled& cancelled) {
  DPAR_CHECK(chunks.size() == static_cast<size_t>(size_) && chunk_bytes.size() == chunks.size(),
             "shm reduce_scatter: ", chunks.size(), " chunks for ", size_, " ranks");
  uint64_t total = 0;
  for (size_t b : chunk_bytes) total += b;
  begin_call({Kind::reduce_scatter, dtype, op, 0, total, &chunk_bytes});
  fold_pieces({chunks, chunk_bytes, dtype_size(dtype), reduce, finish, out, nullptr}, timeout,
              cancelled);
  ++calls_;
}

void ShmCollectives::allgather(const uint8_t* mine, const std::vector<uint8_t*>& outputs,
                               const std::vector<size_t>& chunk_bytes, DType dtype, Millis timeout,
                               const Cancelled& cancelled) {
  DPAR_CHECK(outputs.size() == static_cast<size_t>(size_) && chunk_bytes.size() == outputs.size(),
             "shm allgather: ", outputs.size(), " outputs for ", size_, " ranks");
  uint64_t total = 0;
  size_t longest = 0;
  for (size_t b : chunk_bytes) {
    total += b;
    longest = std::max(longest, b);
  }
  begin_call({Kind::allgather, dtype, std::nullopt, 0, total, &chunk_bytes});
  // Each rank has a whole slot for its piece.
  const size_t piece = slot_bytes_;
  auto count = [&](int r, size_t p) {
    return piece_length(chunk_bytes[static_cast<size_t>(r)], piece, p);
  };
  const size_t pieces = std::max<size_t>((longest + piece - 1) / piece, 1);
  for (size_t p = 0; p < pieces; ++p) {
    const int set = next_set();
    if (const size_t m = count(rank_, p)) std::memcpy(slot(set, rank_), mine + p * piece, m);
    wait_for_all(timeout, cancelled);
    if (p == 0) check_call();
    for (int r = 0; r < size_; ++r) {
      const size_t m = count(r, p);
      if (m == 0 || (r == rank_ && outputs[static_cast<size_t>(r)] == mine)) continue;
      std::memcpy(outputs[static_cast<size_t>(r)] + p * piece, slot(set, r), m);
    }
  }
  ++calls_;
}

void ShmCollectives::broadcast(uint8_t* data, size_t bytes, int root, Millis timeout,
                               const Cancelled& cancelled) {
  begin_call({Kind::broadcast, std::nullopt, std::nullopt, root, bytes, nullptr});
  // The root fills the whole slot set: the slots of a set are consecutive.
  const size_t piece = slot_bytes_ * static_cast<size_t>(size_);
  const size_t pieces = std::max<size_t>((bytes + piece - 1) / piece, 1);
  for (size_t p = 0; p < pieces; ++p) {
    const int set = next_set();
    const size_t length = piece_length(bytes, piece, p);
    if (rank_ == root && length > 0) std::memcpy(slot(set, 0), data + p * piece, length);
    wait_for_all(timeout, cancelled);
    if (p == 0) check_call();
    if (rank_ != root && length > 0) std::memcpy(data + p * piece, slot(set, 0), length);
  }
  ++calls_;
}

void ShmCollectives::barrier(Millis timeout, const Cancelled& cancelled) {
  begin_call({Kind::barrier, std::nullopt, std::nullopt, 0, 0, nullptr});
  wait_for_all(timeout, cancelled);
  check_call();
  ++calls_;
}

}  // namespace dpar::dist::detail
