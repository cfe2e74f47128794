#include "distributed/progress_heartbeat.h"

#include <sstream>
#include <vector>

#include "distributed/store_common.h"

namespace dpar::dist::detail {

ProgressHeartbeat::ProgressHeartbeat(std::shared_ptr<Store> store, int rank, int size, Stall stall,
                                     Millis period)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      stall_(std::move(stall)),
      period_(period) {
  if (size_ > 1 && store_) thread_ = std::thread([this] { loop(); });
}

ProgressHeartbeat::~ProgressHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool ProgressHeartbeat::publish(int64_t seq) {
  std::lock_guard<std::mutex> lock(publish_mutex_);
  if (seq == published_) return true;
  try {
    store_->set(key(rank_), Store::to_bytes(std::to_string(seq)));
    published_ = seq;
    return true;
  } catch (const std::exception&) {
    // The store may be gone while the job shuts down; the heartbeat is diagnostics only.
    return false;
  }
}

void ProgressHeartbeat::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    cv_.wait_for(lock, period_, [&] { return stop_; });
    if (stop_) break;
    const int64_t seq = entered_.load(std::memory_order_relaxed);
    lock.unlock();
    publish(seq);
    check_stall();
    lock.lock();
  }
}

void ProgressHeartbeat::check_stall() {
  if (stall_.after.count() <= 0) return;
  const int64_t seq = entered_.load(std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  if (seq <= completed_.load(std::memory_order_relaxed)) return;  // nothing running
  if (seq != stall_seq_) {
    stall_seq_ = seq;
    stall_since_ = now;
    stall_warned_ = false;
    return;
  }
  if (stall_warned_ || now - stall_since_ < stall_.after) return;
  stall_warned_ = true;
  // Seen once a period, so the wait is known to a period: "2.0 s", not "2001 ms".
  const std::string waited =
      format_seconds(std::chrono::duration_cast<Millis>(now - stall_since_)) + " s";
  std::string line = "stall: rank " + std::to_string(rank_) + " (group " + stall_.group +
                     ") has waited " + waited + " in ";
  if (stall_.describe) {
    line += stall_.describe(seq);
  } else {
    line += '#';
    line += std::to_string(seq);
  }
  line += "; " + describe_laggards(seq) +
          " (DPAR_STALL_WARNING; the collective times out after DPAR_TIMEOUT)";
  log_line(stall_.log, line);
}

std::string ProgressHeartbeat::describe_laggards(int64_t seq) {
  if (size_ <= 1 || !store_) return "every rank entered #" + std::to_string(seq);
  try {
    publish(seq);
    // -1: the rank has not published anything: it entered no collective yet, or did all its
    // collectives within its first heartbeat period.
    std::vector<int64_t> last(size_, -1);
    auto read = [&](int r) {
      if (!store_->check({key(r)})) return int64_t{-1};
      return static_cast<int64_t>(std::stoll(Store::to_string(store_->get(key(r)))));
    };
    std::vector<int> behind;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      last[r] = read(r);
      if (last[r] < seq) behind.push_back(r);
    }
    if (!behind.empty()) {
      // A rank that entered within the last period may not have published yet.
      std::this_thread::sleep_for(period_ + std::chrono::milliseconds(250));
      std::vector<int> still;
      for (int r : behind) {
        last[r] = read(r);
        if (last[r] < seq) still.push_back(r);
      }
      behind.swap(still);
    }
    if (behind.empty()) return "every rank entered #" + std::to_string(seq);
    std::ostringstream os;
    os << "ranks that have not arrived: ";
    constexpr size_t kMaxListed = 16;
    for (size_t i = 0; i < behind.size() && i < kMaxListed; ++i) {
      const int r = behind[i];
      os << (i ? ", " : "") << r;
      if (last[r] > 0) {
        os << " (last entered #" << last[r] << ")";
      } else {
        os << " (no progress published yet)";
      }
    }
    if (behind.size() > kMaxListed) os << " and " << (behind.size() - kMaxListed) << " more";
    return os.str();
  } catch (const std::exception& e) {
    std::string why = e.what();
    for (char& c : why) {
      if (c == '\n') c = ' ';
    }
    return "ranks that have not arrived: unknown (store: " + why + ")";
  }
}

}  // namespace dpar::dist::detail
