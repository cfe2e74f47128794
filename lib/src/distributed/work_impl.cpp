#include "distributed/work_impl.h"

#include "dpar/core/error.h"

namespace dpar::dist::detail {

bool WorkImpl::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void WorkImpl::wait(Millis timeout) {
  // Only an unbounded wait may run the collective here: a bounded one must be able to
  // return when its timeout passes.
  if (timeout.count() <= 0 && !is_completed()) {
    if (auto runner = runner_.lock()) runner->run_inline_until(this);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() <= 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    lock.unlock();
    DPAR_FAIL(info_.describe(), " #", info_.seq, " on rank ", rank_, " (world size ", size_,
              ") has not completed after ", timeout.count(),
              " ms (Work::wait timeout); it is still running");
  }
  if (error_) throw Error(*error_);
}

void WorkImpl::finish(std::optional<std::string> error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace dpar::dist::detail
