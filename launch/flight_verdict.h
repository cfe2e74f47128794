#pragma once
// The launcher's reading of the ranks' flight records (lib/src/distributed/flight_recorder.h):
// each rank writes <dir>/rank<R>.json with its groups' last collectives when one of them times
// out or fails, and on the SIGUSR1 that dpar-launch sends to the ranks still running when one
// dies. From whatever records the directory holds (this node's ranks; every rank's when the
// directory is shared), one verdict: ranks that issued different collectives at the same
// position, else the rank that is behind, at which collective, and who waits for it, else
// that every rank finished its last collective (the failure lies elsewhere).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dpar::launch {

struct FlightEntry {
  int64_t seq = 0;
  std::string call;   // "allreduce(f32[1000])"
  std::string label;  // "DataParallel bucket 0", or ""
  std::string state;  // queued, started, completed, failed
  int64_t started_us = 0;
};

struct FlightGroup {
  std::string name;  // "gloo/1": the same group on every rank
  int size = 0;
  std::vector<FlightEntry> entries;  // by seq
};

struct FlightRecord {
  int rank = -1;
  std::string reason;  // why it was written: "SIGUSR1", "allreduce(f32[1000]) #12 timed out"
  int64_t time_us = 0;
  std::vector<FlightGroup> groups;
};

// The records under dir (rank*.json); a file that cannot be read or parsed adds a line to
// problems instead.
std::vector<FlightRecord> read_flight_records(const std::string& dir,
                                              std::vector<std::string>* problems);

// The verdict, a few lines. world_size: the job's ranks; without_record: what the launcher
// knows of ranks that left no record ("stopped (SIGSTOP)", "killed by SIGKILL").
std::vector<std::string> flight_verdict(const std::vector<FlightRecord>& records, int world_size,
                                        const std::map<int, std::string>& without_record);

}  // namespace dpar::launch
