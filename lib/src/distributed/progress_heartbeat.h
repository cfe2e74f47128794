#pragma once
// Who has not arrived? Each rank of a group publishes the sequence number of the latest
// collective it entered to the group's store ("progress/<rank>") from a background thread,
// once a period and only when the number changed. The hot path only stores an atomic. When a
// collective fails, the failing rank reads the other ranks' keys and names those behind it.
// The same thread gives the early stall warning: a collective still running `Stall::after`
// after it was entered gets one line naming the ranks not yet arrived, long before the
// timeout ends it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

// The early stall warning of a group (ProgressHeartbeat::Stall).
struct StallWarning {
  Millis after{0};                               // 0: no warning
  std::string group;                             // named in the warning ("gloo/1")
  std::function<void(const std::string&)> log;   // empty: stderr, as "dpar: <line>"
  std::function<std::string(int64_t)> describe;  // seq -> "allreduce(f32[1000]) #12"
};

class ProgressHeartbeat {
 public:
  using Stall = StallWarning;
  // store: the group's own (prefixed) store. No thread is started for a world of one.
  ProgressHeartbeat(std::shared_ptr<Store> store, int rank, int size, Stall stall = {},
                    Millis period = std::chrono::seconds(1));
  ~ProgressHeartbeat();
  ProgressHeartbeat(const ProgressHeartbeat&) = delete;
  ProgressHeartbeat& operator=(const ProgressHeartbeat&) = delete;

  // Hot path: records that this rank entered collective #seq.
  void entered(int64_t seq) { entered_.store(seq, std::memory_order_relaxed); }
  // Hot path: collective #seq ended here (either way).
  void completed(int64_t seq) { completed_.store(seq, std::memory_order_relaxed); }

  // After collective #seq failed here: "ranks that have not arrived: 1 (last entered #11), 3
  // (no progress published yet)", "every rank entered #12" when none is behind, or "ranks that have
  // not arrived: unknown (<why>)" when the store cannot be read. Publishes this rank's number
  // first and, when some ranks look behind, waits one heartbeat period so that a rank which
  // arrived just now has had the chance to publish.
  std::string describe_laggards(int64_t seq);

 private:
  void loop();
  void check_stall();         // on the heartbeat thread, once a period
  bool publish(int64_t seq);  // false if the store failed
  std::string key(int rank) const { return "progress/" + std::to_string(rank); }

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const Stall stall_;
  const Millis period_;
  std::atomic<int64_t> entered_{0};
  std::atomic<int64_t> completed_{0};
  // The collective the heartbeat thread saw running, since when, and whether it warned.
  int64_t stall_seq_ = 0;
  std::chrono::steady_clock::time_point stall_since_{};
  bool stall_warned_ = false;
  int64_t published_ = -1;  // guarded by publish_mutex_
  std::mutex publish_mutex_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dpar::dist::detail
