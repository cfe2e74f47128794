#include "distributed/gloo/shm_link.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace dpar::dist::detail {

// The segment: this control block, then kSlots slots of kSlotBytes.
struct ShmLink::Control {
  ShmCounter sent;                       // segments published by the producer; its pid
  ShmCounter consumed;                   // segments released by the consumer; its pid
  alignas(64) uint64_t lengths[kSlots];  // bytes in each slot, set before it is published
  // Each side's give-up mark, written only by that side (0: the producer, 1: the consumer).
  struct Mark {
    std::atomic<uint32_t> broken;  // set once
    char reason[500];              // why, written before `broken`
  } marks[2];
};

namespace {

constexpr size_t kControlBytes = 4096;

std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

ShmLink::ShmLink(ShmMapping mapping, bool producer, int me, ShmPeer peer)
    : mapping_(std::move(mapping)), producer_(producer), me_(me), peer_(std::move(peer)) {
  static_assert(sizeof(Control) <= kControlBytes, "the control block fits its page");
}

ShmLink::~ShmLink() { munmap(mapping_.base, mapping_.bytes); }

ShmLink::Control& ShmLink::control() const { return *reinterpret_cast<Control*>(mapping_.base); }

uint8_t* ShmLink::slot(uint64_t index) const {
  return mapping_.base + kControlBytes + (index % kSlots) * kSlotBytes;
}

ShmCheck ShmLink::broken_check() const {
  return [this]() -> std::string {
    const Control::Mark& theirs = control().marks[producer_ ? 1 : 0];
    if (theirs.broken.load(std::memory_order_acquire) == 0) return {};
    return "rank " + std::to_string(peer_.rank()) + " gave up on the collective: " +
           std::string(theirs.reason, strnlen(theirs.reason, sizeof theirs.reason));
  };
}

void ShmLink::send(const uint8_t* data, size_t bytes,
                   std::chrono::steady_clock::time_point deadline, Millis timeout,
                   const std::function<std::string()>& cancelled) {
  Control& c = control();
  // Slot sent_ % kSlots is free once the consumer released segment sent_ - kSlots.
  if (sent_ >= kSlots) {
    shm_wait(c.consumed, static_cast<uint32_t>(sent_ - kSlots + 1), peer_, broken_check(), deadline,
             timeout, cancelled);
  }
  std::memcpy(slot(sent_), data, bytes);
  c.lengths[sent_ % kSlots] = bytes;
  ++sent_;
  shm_advance(c.sent, static_cast<uint32_t>(sent_));
}

const uint8_t* ShmLink::receive(size_t bytes, std::chrono::steady_clock::time_point deadline,
                                Millis timeout, const std::function<std::string()>& cancelled) {
  Control& c = control();
  shm_wait(c.sent, static_cast<uint32_t>(consumed_ + 1), peer_, broken_check(), deadline, timeout,
           cancelled);
  const uint64_t got = c.lengths[consumed_ % kSlots];
  if (got != bytes) {
    throw ShmFailure("rank " + std::to_string(peer_.rank()) + " sent a segment of " +
                         std::to_string(got) + " bytes where rank " + std::to_string(me_) +
                         " expected " + std::to_string(bytes) +
                         ": the ranks called different collectives",
                     false);
  }
  return slot(consumed_);
}

void ShmLink::release() {
  ++consumed_;
  shm_advance(control().consumed, static_cast<uint32_t>(consumed_));
}

void ShmLink::mark_broken(const std::string& why) {
  Control& c = control();
  Control::Mark& mine = c.marks[producer_ ? 0 : 1];
  if (mine.broken.load() != 0) return;
  const size_t n = std::min(why.size(), sizeof mine.reason - 1);
  std::memcpy(mine.reason, why.data(), n);
  mine.reason[n] = '\0';
  mine.broken.store(1, std::memory_order_release);
  // Whichever counter the other side sleeps on: wake it to see the mark.
  shm_wake(producer_ ? c.sent : c.consumed);
}

void RingLinks::mark_broken(const std::string& why) {
  if (to_next) to_next->mark_broken(why);
  if (from_prev) from_prev->mark_broken(why);
}

RingLinks connect_ring_links(Store& store, int rank, int size,
                             const std::vector<std::string>& hosts, Millis timeout,
                             std::string* why_not) {
  RingLinks links;
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  auto same_host = [&](int a, int b) {
    return a != b && hosts[static_cast<size_t>(a)] == hosts[static_cast<size_t>(b)];
  };
  auto key = [](const char* what, int producer) {
    return std::string("shm/link/") + what + "/" + std::to_string(producer);
  };
  const size_t bytes = kControlBytes + ShmLink::kSlots * ShmLink::kSlotBytes;
  // 1. As producer: make the segment of the hop to the next rank, publish its name (or why not).
  std::string name;
  ShmMapping out;
  if (same_host(rank, next)) {
    name = new_shm_segment_name("link");
    out = map_shm_segment(name, bytes, /*create=*/true);
    if (out.base) {
      auto* c = reinterpret_cast<ShmLink::Control*>(out.base);
      c->sent.pid.store(static_cast<int32_t>(getpid()));
    }
    store.set(key("segment", rank), bytes_of(out.base ? name : "!" + out.error));
  }
  // Should a store call below fail (a peer gone while connecting), the segment goes with it
  // rather than staying in /dev/shm until the machine restarts.
  struct Cleanup {
    const std::string& name;
    ShmMapping& out;
    bool unlinked = false;
    ~Cleanup() {
      if (out.base && !unlinked) shm_unlink(name.c_str());
      if (out.base) munmap(out.base, out.bytes);
    }
  } cleanup{name, out};
  // 2. As consumer: map the previous rank's segment and say whether that worked. Every rank
  // publishes before it waits, so no two ranks wait on each other.
  if (same_host(prev, rank)) {
    store.wait({key("segment", prev)}, timeout);
    const std::string theirs = text(store.get(key("segment", prev)));
    ShmMapping in =
        theirs.rfind('!', 0) == 0
            ? ShmMapping{nullptr, 0, "rank " + std::to_string(prev) + ": " + theirs.substr(1)}
            : map_shm_segment(theirs, bytes, /*create=*/false);
    int32_t producer_pid = 0;
    if (in.base) {
      auto* c = reinterpret_cast<ShmLink::Control*>(in.base);
      c->consumed.pid.store(static_cast<int32_t>(getpid()));
      producer_pid = c->sent.pid.load();
    }
    store.set(key("mapped", prev), bytes_of(in.base ? "" : in.error));
    if (in.base) {
      links.from_prev.reset(
          new ShmLink(std::move(in), /*producer=*/false, rank, ShmPeer(prev, producer_pid)));
    }
  }
  // 3. As producer: the consumer's answer; the name goes once it is mapped (or failed), so the
  // segment lives exactly as long as the two processes that map it.
  if (same_host(rank, next)) {
    store.wait({key("mapped", rank)}, timeout);
    if (out.base) shm_unlink(name.c_str());
    cleanup.unlinked = true;
    const std::string error = text(store.get(key("mapped", rank)));
    if (out.base && error.empty()) {
      auto* c = reinterpret_cast<ShmLink::Control*>(out.base);
      ShmPeer consumer(next, c->consumed.pid.load());
      links.to_next.reset(new ShmLink(std::exchange(out, ShmMapping{}), /*producer=*/true, rank,
                                      std::move(consumer)));
    }
  }
  // 4. The whole ring's count, for the group's description: every same-host hop's answer.
  std::vector<std::string> answers;
  std::vector<int> producers;
  for (int r = 0; r < size; ++r) {
    if (!same_host(r, (r + 1) % size)) continue;
    producers.push_back(r);
    answers.push_back(key("mapped", r));
  }
  if (!answers.empty()) store.wait(answers, timeout);
  std::string first_error;
  for (int r : producers) {
    const std::string error = text(store.get(key("mapped", r)));
    if (error.empty()) {
      ++links.shm_hops;
    } else if (first_error.empty()) {
      first_error =
          "rank " + std::to_string(r) + " -> " + std::to_string((r + 1) % size) + ": " + error;
    }
  }
  if (links.shm_hops == 0) {
    if (why_not) {
      *why_not = producers.empty() ? "no two neighbouring ranks of the ring share a host"
                                   : "no shared-memory segment: " + first_error;
    }
    links.to_next.reset();
    links.from_prev.reset();
    return links;
  }
  links.summary = "shared memory within hosts (" + std::to_string(links.shm_hops) + " of " +
                  std::to_string(size) + " ring hops), tcp between them";
  if (!first_error.empty()) links.summary += "; tcp for " + first_error;
  return links;
}

}  // namespace dpar::dist::detail
