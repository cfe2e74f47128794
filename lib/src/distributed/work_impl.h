#pragma once
// The Work returned by the process groups: completed by the group's communication thread,
// waited on by the caller.
#include <condition_variable>
#include <exception>
#include <mutex>

#include "distributed/collective_check.h"
#include "dpar/distributed/process_group.h"

namespace dpar::dist::detail {

class WorkImpl final : public Work {
 public:
  // The description is formatted only when wait() times out, so the hot path builds no text.
  WorkImpl(CollectiveInfo info, int rank, int size)
      : info_(std::move(info)), rank_(rank), size_(size) {}
  const CollectiveInfo& info() const { return info_; }

  bool is_completed() override;
  // A zero timeout waits until the collective finishes: the communication thread bounds every
  // collective by the group's timeout, so this cannot wait longer than that (plus the
  // collectives queued before this one, which fail fast once the group has failed).
  void wait(Millis timeout = Millis(0)) override;

  // Called once by the communication thread; error is null on success.
  void finish(std::exception_ptr error);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  const CollectiveInfo info_;
  const int rank_;
  const int size_;
};

}  // namespace dpar::dist::detail
