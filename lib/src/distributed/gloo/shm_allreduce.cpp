#include "distributed/gloo/shm_allreduce.h"

#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>

#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

// One cache line per rank, so a rank's arrivals never share a line with another's.
struct alignas(64) RankControl {
  std::atomic<uint32_t> arrived;   // barriers this rank has reached (wraps; compared by difference)
  std::atomic<uint32_t> sleepers;  // ranks asleep on `arrived`: the arriving rank wakes them
  std::atomic<int32_t> pid;
  // What this rank is all-reducing (elements and their size), checked by every rank after the
  // first barrier: over TCP a mismatch fails in the transport, here it would pass silently.
  std::atomic<uint64_t> numel;
  std::atomic<uint32_t> element_size;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "barrier words must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words are 32 bits");

constexpr size_t kPage = 4096;
constexpr size_t kMaxSegmentBytes = 64 << 20;

size_t control_bytes(int size) {
  return (static_cast<size_t>(size) * sizeof(RankControl) + kPage - 1) / kPage * kPage;
}

RankControl& control(uint8_t* base, int rank) { return reinterpret_cast<RankControl*>(base)[rank]; }

uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

// Shared (not process-private) futex: the waiters are other processes.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, long nanoseconds) {
  timespec ts{0, nanoseconds};
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string namespace_inode(const char* path) {
  struct stat st {};
  return stat(path, &st) == 0 ? std::to_string(st.st_ino) : std::string("?");
}

std::string errno_text(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

struct Mapping {
  uint8_t* base = nullptr;
  std::string error;
};

// Maps the segment (created by rank 0, sized and backed first so that a full /dev/shm is an
// error here rather than a SIGBUS at the first touch).
Mapping map_segment(const std::string& name, size_t bytes, bool create) {
  const int fd = shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return {nullptr, errno_text("shm_open")};
  if (create) {
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return {nullptr, std::string("posix_fallocate of ") + std::to_string(bytes >> 20) +
                           " MiB in /dev/shm: " + std::strerror(err)};
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return {nullptr, errno_text("mmap")};
  return {static_cast<uint8_t*>(base), ""};
}

}  // namespace

std::string shm_host_identity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return "boot " + read_first_line("/proc/sys/kernel/random/boot_id") + ", host " + host +
         ", net ns " + namespace_inode("/proc/self/ns/net") + ", pid ns " +
         namespace_inode("/proc/self/ns/pid");
}

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

  // 1. Same host? Every rank sees every identity, so every rank decides alike.
  const std::string me = shm_host_identity();
  store.set(key("host", rank), bytes_of(me));
  store.wait(all_keys("host"), timeout);
  for (int r = 0; r < size; ++r) {
    if (text(store.get(key("host", r))) != me) {
      return refuse("rank " + std::to_string(r) + " runs on another host");
    }
  }

  // 2. Rank 0 creates the segment and publishes its name, or why it could not.
  const size_t slot = slot_bytes(size);
  const size_t bytes = control_bytes(size) + 2 * static_cast<size_t>(size) * slot;
  std::string name;
  Mapping mapping;
  if (rank == 0) {
    std::random_device random;
    name = "/dpar-shm-" + std::to_string(getpid()) + "-" + std::to_string(random());
    mapping = map_segment(name, bytes, /*create=*/true);
    store.set("shm/segment", bytes_of(mapping.base ? name : "!" + mapping.error));
  } else {
    store.wait({"shm/segment"}, timeout);
    name = text(store.get("shm/segment"));
    mapping = name.rfind('!', 0) == 0 ? Mapping{nullptr, "rank 0: " + name.substr(1)}
                                      : map_segment(name, bytes, /*create=*/false);
  }
  if (mapping.base) control(mapping.base, rank).pid.store(static_cast<int32_t>(getpid()));

  // 3. Every rank says whether it mapped it; rank 0 then unlinks the name, so the segment goes
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
  // A pidfd per peer (every pid is in the segment once all ranks mapped it): it turns readable
  // the moment the peer exits, before its parent reaps it, as a TCP peer's socket closes. Where
  // pidfd_open is missing, -1, and kill(pid, 0) is asked instead.
  for (int r = 0; r < size_; ++r) {
    const int32_t pid = control(base_, r).pid.load();
    peer_pidfds_.push_back(r == rank_ ? -1 : static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  }
}

ShmAllreduce::~ShmAllreduce() {
  for (int fd : peer_pidfds_) {
    if (fd >= 0) close(fd);
  }
  munmap(base_, bytes_);
}

bool ShmAllreduce::peer_exited(int peer) const {
  if (const int fd = peer_pidfds_[static_cast<size_t>(peer)]; fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  return kill(control(base_, peer).pid.load(), 0) != 0 && errno == ESRCH;
}

uint8_t* ShmAllreduce::slot(int set, int rank) const {
  return base_ + control_bytes(size_) +
         (static_cast<size_t>(set) * static_cast<size_t>(size_) + static_cast<size_t>(rank)) *
             slot_bytes_;
}

void ShmAllreduce::wait_for(int peer, uint32_t target,
                            std::chrono::steady_clock::time_point deadline, Millis timeout,
                            const std::function<std::string()>& cancelled) {
  RankControl& c = control(base_, peer);
  auto reached = [&](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  // A short spin first: a peer a few microseconds behind is the common case.
  for (int i = 0; i < 2000; ++i) {
    if (reached(c.arrived.load(std::memory_order_acquire))) return;
    _mm_pause();
  }
  for (int64_t naps = 0;; ++naps) {
    c.sleepers.fetch_add(1);
    const uint32_t seen = c.arrived.load();
    if (!reached(seen)) futex_wait(c.arrived, seen, 1000000);  // 1 ms, then look around
    c.sleepers.fetch_sub(1);
    if (reached(c.arrived.load(std::memory_order_acquire))) return;
    // After every nap: a dead peer must fail the collective at once, as a closed TCP connection
    // does, before its launcher restarts it (an elastic job then sees the death first).
    if (peer_exited(peer)) {
      throw ShmFailure("rank " + std::to_string(peer) + " (pid " + std::to_string(c.pid.load()) +
                           ") exited in the middle of the collective",
                       false);
    }
    if (naps % 16 != 15) continue;
    if (std::string why = cancelled ? cancelled() : ""; !why.empty()) {
      throw ShmFailure("aborted: " + why, false);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw ShmFailure("timed out after " + std::to_string(timeout.count()) + " ms", true);
    }
  }
}

void ShmAllreduce::barrier(Millis timeout, const std::function<std::string()>& cancelled) {
  const uint32_t target = ++barriers_;
  RankControl& mine = control(base_, rank_);
  mine.arrived.store(target);
  if (mine.sleepers.load() > 0) futex_wake_all(mine.arrived);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 1; r < size_; ++r)
    wait_for((rank_ + r) % size_, target, deadline, timeout, cancelled);
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
