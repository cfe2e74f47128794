#include "flight_collect.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "flight_verdict.h"

namespace dpar::launch {
namespace {

namespace fs = std::filesystem;

// The state letter of /proc/<pid>/stat ('T': stopped), or 0 when it cannot be read.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '\0';
}

fs::path record_path(const std::string& dir, int rank) {
  return fs::path(dir) / ("rank" + std::to_string(rank) + ".json");
}

}  // namespace

FlightCollector::FlightCollector(const std::string& log_dir, const std::string& chosen,
                                 int world_size, const std::vector<int>& local_ranks)
    : world_size_(world_size) {
  for (int rank = 0; rank < world_size; ++rank) {
    if (std::find(local_ranks.begin(), local_ranks.end(), rank) == local_ranks.end()) {
      remote_ranks_.insert(rank);
    }
  }
  if (!chosen.empty()) {
    dir_ = chosen;
  } else if (!log_dir.empty()) {
    dir_ = (fs::path(log_dir) / "flight_recorder").string();
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/dpar-launch-flight-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      dir_ = pattern;
      owned_ = true;
    }
  }
}

FlightCollector::~FlightCollector() {
  std::error_code ec;
  if (owned_) fs::remove_all(dir_, ec);
}

void FlightCollector::clear() {
  requested_ = false;
  states_.clear();
  std::error_code ec;
  if (dir_.empty() || !fs::is_directory(dir_, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank", 0) == 0 || name.rfind("listening.", 0) == 0) {
      fs::remove(entry.path(), ec);
    }
  }
}

void FlightCollector::request(int failed_rank, const std::string& state,
                              const std::vector<std::pair<int, pid_t>>& running,
                              std::chrono::milliseconds wait) {
  if (dir_.empty()) return;
  requested_ = true;
  states_[failed_rank] = state;
  const auto asked = fs::file_time_type::clock::now();
  std::set<int> pending;
  for (const auto& [rank, pid] : running) {
    if (process_state(pid) == 'T') {
      states_[rank] = "stopped (SIGSTOP or a debugger), pid " + std::to_string(pid);
      continue;
    }
    // Only a process that installed dpar's handler (it left listening.<pid>): SIGUSR1 kills
    // any other, before it could act on the SIGTERM of the teardown.
    std::error_code ec;
    if (!fs::exists(fs::path(dir_) / ("listening." + std::to_string(pid)), ec)) continue;
    if (::kill(pid, SIGUSR1) == 0) pending.insert(rank);
  }
  std::set<int> remote = remote_ranks_;
  // Each asked rank rewrites its file, a remote one writes it at all; the wait ends when every
  // one has, or at `wait`.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!(pending.empty() && remote.empty()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto it = pending.begin(); it != pending.end();) {
      std::error_code ec;
      const auto written = fs::last_write_time(record_path(dir_, *it), ec);
      it = !ec && written >= asked ? pending.erase(it) : std::next(it);
    }
    for (auto it = remote.begin(); it != remote.end();) {
      std::error_code ec;
      it = fs::exists(record_path(dir_, *it), ec) ? remote.erase(it) : std::next(it);
    }
  }
  for (int rank : pending) states_.emplace(rank, "no answer to SIGUSR1");
  for (int rank : remote) states_.emplace(rank, "on another node");
}

std::vector<std::string> FlightCollector::verdict() const {
  if (!requested_) return {};
  std::vector<std::string> problems;
  const std::vector<FlightRecord> records = read_flight_records(dir_, &problems);
  std::vector<std::string> lines = flight_verdict(records, world_size_, states_);
  lines.insert(lines.end(), problems.begin(), problems.end());
  return lines;
}

}  // namespace dpar::launch
