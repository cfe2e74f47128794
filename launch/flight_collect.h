#pragma once
// The launcher's side of the flight recorder: the folder the ranks write their records to
// (DPAR_FLIGHT_RECORDER_DIR), the SIGUSR1 that asks the ranks still running for theirs when
// one rank fails, and the verdict (flight_verdict.h) printed after the teardown.
#include <sys/types.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dpar::launch {

class FlightCollector {
 public:
  // The records go to <log_dir>/flight_recorder (kept with the logs), or, when the logs go to
  // the console, to a private folder under $TMPDIR that is removed with the collector; `chosen`
  // (a DPAR_FLIGHT_RECORDER_DIR the user set) wins over both. local_ranks: this node's.
  FlightCollector(const std::string& log_dir, const std::string& chosen, int world_size,
                  const std::vector<int>& local_ranks);
  ~FlightCollector();
  FlightCollector(const FlightCollector&) = delete;
  FlightCollector& operator=(const FlightCollector&) = delete;

  const std::string& dir() const { return dir_; }
  bool kept() const { return !owned_; }
  // Before each start: an earlier attempt's records must not speak for this one.
  void clear();
  // A rank failed (`state`: "exited with code 1"): every rank in `running` (rank, pid) that
  // answers SIGUSR1 (it left <dir>/listening.<pid>) gets it and up to `wait` to write its
  // record; a stopped process cannot, and is noted so. Ranks of other nodes get the same time
  // for their record to appear: in a folder the nodes share they write it when their own
  // collectives fail (elsewhere the wait finds nothing).
  void request(int failed_rank, const std::string& state,
               const std::vector<std::pair<int, pid_t>>& running,
               std::chrono::milliseconds wait = std::chrono::milliseconds(2000));
  // After the teardown: the verdict lines (empty if nothing was requested).
  std::vector<std::string> verdict() const;

 private:
  std::string dir_;
  bool owned_ = false;  // a temporary folder of ours
  int world_size_;
  std::set<int> remote_ranks_;  // the job's ranks on other nodes
  bool requested_ = false;
  std::map<int, std::string> states_;  // what the launcher knows of local ranks
};

}  // namespace dpar::launch
