#pragma once
// The Work returned by the process groups: completed by the group's communication thread,
// waited on by the caller.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "distributed/collective_check.h"
#include "dpar/distributed/process_group.h"

namespace dpar::dist::detail {

class WorkImpl;

// A group whose queued collectives a waiting caller may run itself (see WorkImpl::wait).
class InlineRunner {
 public:
  virtual ~InlineRunner() = default;
  // Runs, on the calling thread, the queued collectives up to and including `work` if no
  // other thread is running one of the group's collectives and `work` has not started;
  // otherwise does nothing (the communication thread will run it).
  virtual void run_inline_until(const WorkImpl* work) = 0;
};

class WorkImpl final : public Work {
 public:
  // The description is formatted only when wait() times out, so the hot path builds no text.
  // runner: the issuing group, or empty when waiters must always block.
  WorkImpl(CollectiveInfo info, int rank, int size, std::weak_ptr<InlineRunner> runner = {})
      : info_(std::move(info)), rank_(rank), size_(size), runner_(std::move(runner)) {}
  const CollectiveInfo& info() const { return info_; }

  bool is_completed() override;
  // A zero timeout waits until the collective finishes: the communication thread bounds every
  // collective by the group's timeout, so this cannot wait longer than that (plus the
  // collectives queued before this one, which fail fast once the group has failed). If the
  // collective has not started and the group is idle, the waiting thread runs it itself:
  // `allreduce(...)->wait()` then costs no hand-off to the communication thread and back,
  // two thread wake-ups that each cost a scheduler time slice on a busy machine.
  void wait(Millis timeout = Millis(0)) override;

  // Called once by the thread that ran the collective: the failure's message, or nullopt.
  void finish(std::optional<std::string> error);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  // The failure as text, and each wait() throws its own dpar::Error built from it. Rethrowing
  // one shared exception object would hand it between threads through the reference count
  // libstdc++ keeps inside the exception, which ThreadSanitizer cannot see (libstdc++ is not
  // instrumented): the thread that ran the collective may free the object after the waiter
  // read it, and TSan reports a race that the count in fact orders.
  std::optional<std::string> error_;
  const CollectiveInfo info_;
  const int rank_;
  const int size_;
  const std::weak_ptr<InlineRunner> runner_;
};

}  // namespace dpar::dist::detail
