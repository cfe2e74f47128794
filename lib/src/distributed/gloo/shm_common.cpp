#include "distributed/gloo/shm_common.h"

#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

namespace dpar::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

// Shared (not process-private) futex: the waiters are other processes.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, long nanoseconds) {
  timespec ts{0, nanoseconds};
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
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

}  // namespace

std::string shm_host_identity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return "boot " + read_first_line("/proc/sys/kernel/random/boot_id") + ", host " + host +
         ", net ns " + namespace_inode("/proc/self/ns/net") + ", pid ns " +
         namespace_inode("/proc/self/ns/pid");
}

std::vector<std::string> exchange_host_identities(Store& store, int rank, int size,
                                                  const std::string& mine, Millis timeout) {
  auto key = [](int r) { return "shm/host/" + std::to_string(r); };
  store.set(key(rank), Bytes(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key(r));
  store.wait(keys, timeout);
  std::vector<std::string> identities;
  for (int r = 0; r < size; ++r) {
    const Bytes b = store.get(key(r));
    identities.emplace_back(b.begin(), b.end());
  }
  return identities;
}

void shm_advance(ShmCounter& counter, uint32_t value) {
  // Sequentially consistent, not a release store: a waiter announces itself (sleepers) and then
  // reads the value; this side writes the value and then reads sleepers. Only a full fence
  // between each pair keeps both from reading the old word (a lost wake-up: the waiter would
  // sleep out its whole nap).
  counter.value.store(value);
  if (counter.sleepers.load() > 0) shm_wake(counter);
}

void shm_wake(ShmCounter& counter) {
  syscall(SYS_futex, futex_word(counter.value), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

ShmMapping map_shm_segment(const std::string& name, size_t bytes, bool create) {
  const int fd = shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return {nullptr, 0, errno_text("shm_open")};
  if (create) {
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return {nullptr, 0,
              "posix_fallocate of " + std::to_string((bytes + (1 << 20) - 1) >> 20) +
                  " MiB in /dev/shm: " + std::strerror(err)};
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return {nullptr, 0, errno_text("mmap")};
  return {static_cast<uint8_t*>(base), bytes, ""};
}

std::string new_shm_segment_name(const char* what) {
  std::random_device random;
  return std::string("/dpar-") + what + "-" + std::to_string(getpid()) + "-" +
         std::to_string(random());
}

ShmPeer::ShmPeer(int rank, int32_t pid)
    : rank_(rank), pid_(pid), pidfd_(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))) {}

ShmPeer::~ShmPeer() {
  if (pidfd_ >= 0) close(pidfd_);
}

ShmPeer::ShmPeer(ShmPeer&& other) noexcept
    : rank_(other.rank_), pid_(other.pid_), pidfd_(std::exchange(other.pidfd_, -1)) {}

ShmPeer& ShmPeer::operator=(ShmPeer&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) close(pidfd_);
    rank_ = other.rank_;
    pid_ = other.pid_;
    pidfd_ = std::exchange(other.pidfd_, -1);
  }
  return *this;
}

bool ShmPeer::exited() const {
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  return pid_ > 0 && kill(pid_, 0) != 0 && errno == ESRCH;
}

void shm_wait(ShmCounter& counter, uint32_t target, const ShmPeer& peer, const ShmCheck& check,
              std::chrono::steady_clock::time_point deadline, Millis timeout,
              const std::function<std::string()>& cancelled) {
  auto reached = [&](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  // A short spin first, while waits end quickly (the peer a few microseconds behind, as in a
  // loop of collectives). Once a wait has lasted longer (the peer still computing, as while
  // DataParallel's communication thread waits during backward), this thread sleeps at once
  // until a wait is short again: on cores shared with the training threads every spin is time
  // taken from them (bench_ddp, 2 ranks x 1 thread on 2 cores: rank 0 used 19 ms more CPU per
  // MobileNetV3 step than an independent process with the spin always on, 4 ms with this).
  thread_local bool spin = true;
  const auto start = Clock::now();
  struct Adapt {
    Clock::time_point start;
    ~Adapt() { spin = Clock::now() - start < std::chrono::microseconds(50); }
  } adapt{start};
  for (int i = 0; spin && i < 2000; ++i) {
    if (reached(counter.value.load(std::memory_order_acquire))) return;
    _mm_pause();
  }
  for (int64_t naps = 0;; ++naps) {
    counter.sleepers.fetch_add(1);
    const uint32_t seen = counter.value.load();
    if (!reached(seen)) futex_wait(counter.value, seen, 1000000);  // 1 ms, then look around
    counter.sleepers.fetch_sub(1);
    if (reached(counter.value.load(std::memory_order_acquire))) return;
    // After every nap: a dead peer must fail the collective at once, as a closed TCP connection
    // does, before its launcher restarts it (an elastic job then sees the death first).
    if (peer.exited()) {
      throw ShmFailure("rank " + std::to_string(peer.rank()) + " (pid " +
                           std::to_string(counter.pid.load()) +
                           ") exited in the middle of the collective",
                       false);
    }
    if (check) {
      if (std::string why = check(); !why.empty()) throw ShmFailure(why, false);
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

}  // namespace dpar::dist::detail
