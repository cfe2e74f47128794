#pragma once
// A per-op wall-clock profiler for finding where a training step spends its time. Off by
// default (one branch per op); enable with profiler::set_enabled(true) or DPAR_PROFILE=1.
// Forward ops are timed by DPAR_PROFILE_SCOPE in the op; backward nodes by the autograd
// engine under "<name>_backward".
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dpar::profiler {

bool enabled();
void set_enabled(bool on);
void reset();
void record(const std::string& name, int64_t nanoseconds);
struct Row {
  std::string name;
  int64_t calls = 0;
  int64_t nanoseconds = 0;
};
// What has been recorded since the last reset, sorted by total time (largest first).
std::vector<Row> rows();
// A table of rows(): name, calls, total ms, share of all recorded time.
std::string report();
// Called at the start and the end of every recorded region while profiling: a device backend
// whose kernels run asynchronously (CUDA) installs a wait for its queued work here, so that a
// region is charged with the device time of what it enqueued rather than the launch alone.
void set_device_sync(void (*sync)());

// Times one region. Only the outermost region on a thread is recorded, so ops called inside
// a backward node (e.g. mul inside mul_backward) are not counted twice and shares add up.
class Scope {
 public:
  explicit Scope(const char* name) {
    if (enabled()) begin(name);
  }
  explicit Scope(const std::string& name) {
    if (enabled()) begin(name);
  }
  ~Scope() {
    if (active_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin(std::string name);
  void end();
  bool active_ = false;
  bool outermost_ = false;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dpar::profiler

#define DPAR_PROFILE_CONCAT_(a, b) a##b
#define DPAR_PROFILE_CONCAT(a, b) DPAR_PROFILE_CONCAT_(a, b)
#define DPAR_PROFILE_SCOPE(name) \
  ::dpar::profiler::Scope DPAR_PROFILE_CONCAT(dpar_profile_scope_, __LINE__)(name)
