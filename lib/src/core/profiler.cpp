#include "dpar/core/profiler.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace dpar::profiler {
namespace {

struct Entry {
  int64_t calls = 0;
  int64_t nanoseconds = 0;
};

std::atomic<bool>& flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("DPAR_PROFILE");
    return env != nullptr && env[0] != '\0' && env[0] != '0';
  }()};
  return on;
}

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}

thread_local int scope_depth = 0;

std::atomic<void (*)()>& device_sync() {
  static std::atomic<void (*)()> hook{nullptr};
  return hook;
}

void sync_device() {
  if (auto* sync = device_sync().load(std::memory_order_relaxed)) sync();
}

std::map<std::string, Entry>& table() {
  static std::map<std::string, Entry> t;
  return t;
}

}  // namespace

void Scope::begin(std::string name) {
  active_ = true;
  outermost_ = scope_depth++ == 0;
  if (outermost_) {
    name_ = std::move(name);
    sync_device();
    start_ = std::chrono::steady_clock::now();
  }
}

void Scope::end() {
  --scope_depth;
  if (outermost_) {
    sync_device();
    record(name_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count());
  }
}

bool enabled() { return flag().load(std::memory_order_relaxed); }
void set_enabled(bool on) { flag().store(on); }
void set_device_sync(void (*sync)()) { device_sync().store(sync); }

void reset() {
  std::lock_guard<std::mutex> lock(table_mutex());
  table().clear();
}

void record(const std::string& name, int64_t nanoseconds) {
  std::lock_guard<std::mutex> lock(table_mutex());
  Entry& e = table()[name];
  ++e.calls;
  e.nanoseconds += nanoseconds;
}

std::vector<Row> rows() {
  std::vector<Row> out;
  {
    std::lock_guard<std::mutex> lock(table_mutex());
    for (const auto& [name, e] : table()) out.push_back({name, e.calls, e.nanoseconds});
  }
  std::sort(out.begin(), out.end(),
            [](const Row& a, const Row& b) { return a.nanoseconds > b.nanoseconds; });
  return out;
}

std::string report() {
  const std::vector<Row> all = rows();
  int64_t total = 0;
  for (const Row& r : all) total += r.nanoseconds;
  std::string out = "op                                    calls    total ms   share\n";
  char line[160];
  for (const Row& r : all) {
    std::snprintf(
        line, sizeof line, "%-36s %7lld %11.2f %6.1f%%\n", r.name.c_str(),
        static_cast<long long>(r.calls), r.nanoseconds / 1e6,
        total ? 100.0 * static_cast<double>(r.nanoseconds) / static_cast<double>(total) : 0.0);
    out += line;
  }
  return out;
}

}  // namespace dpar::profiler
