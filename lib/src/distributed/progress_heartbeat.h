#pragma once
// Who has not arrived? Each rank of a group publishes the sequence number of the latest
// collective it entered to the group's store ("progress/<rank>") from a background thread,
// once a period and only when the number changed. The hot path only stores an atomic. When a
// collective fails, the failing rank reads the other ranks' keys and names those behind it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

class ProgressHeartbeat {
 public:
  // store: the group's own (prefixed) store. No thread is started for a world of one.
  ProgressHeartbeat(std::shared_ptr<Store> store, int rank, int size,
                    Millis period = std::chrono::seconds(1));
  ~ProgressHeartbeat();
  ProgressHeartbeat(const ProgressHeartbeat&) = delete;
  ProgressHeartbeat& operator=(const ProgressHeartbeat&) = delete;

  // Hot path: records that this rank entered collective #seq.
  void entered(int64_t seq) { entered_.store(seq, std::memory_order_relaxed); }

  // After collective #seq failed here: "ranks that have not arrived: 1 (last entered #11), 3
  // (no collective yet)", "every rank entered #12" when none is behind, or "ranks that have
  // not arrived: unknown (<why>)" when the store cannot be read. Publishes this rank's number
  // first and, when some ranks look behind, waits one heartbeat period so that a rank which
  // arrived just now has had the chance to publish.
  std::string describe_laggards(int64_t seq);

 private:
  void loop();
  bool publish(int64_t seq);  // false if the store failed
  std::string key(int rank) const { return "progress/" + std::to_string(rank); }

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const Millis period_;
  std::atomic<int64_t> entered_{0};
  int64_t published_ = -1;  // guarded by publish_mutex_
  std::mutex publish_mutex_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dpar::dist::detail
