#pragma once
// The flight recorder: every process group keeps its last collectives (the call, its label,
// when it was queued, started and ended, on which thread) in a fixed ring, and the process
// writes all its groups' rings as one JSON file when a collective times out or fails, on
// SIGUSR1 (dpar-launch sends it to the ranks still running when one dies), or on request.
// dpar-launch reads every rank's file and prints one verdict (launch/flight_verdict.h): which
// rank is behind, at which collective, and who waits for it. PyTorch's NCCL flight recorder
// (TORCH_NCCL_TRACE_BUFFER_SIZE) is the model; this one records every backend.
//
// Environment: DPAR_FLIGHT_RECORDER_DIR (where the file goes; dpar-launch sets
// <log_dir>/flight_recorder; default $TMPDIR, else /tmp), DPAR_FLIGHT_RECORDER_SIZE (entries
// per group, default 2000; 0 turns recording off). The file is <dir>/rank<R>.json, R being
// DPAR_RANK when set, else the rank of the process's first group; each dump replaces it
// whole (written aside, then renamed). A process that answers SIGUSR1 says so with an empty
// <dir>/listening.<pid>, so that dpar-launch signals no program that SIGUSR1 would kill.
//
// Cost: a record is a copy of the call's description into a preallocated slot and three
// clock reads under an uncontended mutex (bench_allreduce --recorder measures it).
#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "distributed/collective_check.h"

namespace dpar::dist::detail {

// Names the collectives the calling thread issues while it lives ("DataParallel bucket 3");
// the recorder keeps the name beside each. An inner label replaces the outer one until it ends.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;
  // The calling thread's innermost label, or "".
  static const std::string& current();

 private:
  std::string previous_;
};

class FlightRecorder {
 public:
  // group: the group's name, the same on every rank ("gloo/1"). Registers the recorder with
  // the process's dump; installs the SIGUSR1 handler on first use (only where SIGUSR1 still
  // has its default action: a program's own handler is left alone).
  FlightRecorder(std::string group, std::string backend, int rank, int size);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  bool enabled() const { return !ring_.empty(); }
  // Hot path, by the group: the call was queued (info.seq set), started running, ended.
  void enqueued(const CollectiveInfo& info);
  void started(int64_t seq);
  void ended(int64_t seq, bool ok);

  // The group failed in `info` (timed out, or its transport failed) and cannot go on: marks
  // the entry failed, notes the failure process-wide (note_group_failed) and writes the
  // process's record. Returns " (flight record: <path>)" for the error line, or "".
  std::string record_failure(const CollectiveInfo& info, bool timed_out);
  // "allreduce(f32[1000]) #12 (DataParallel bucket 3)", or "#12" once its entry is gone.
  std::string describe(int64_t seq) const;
  // This group's record as a JSON object, entries oldest first.
  nlohmann::json json() const;
  // Entries in the ring, for tests.
  size_t size() const;

 private:
  struct Entry {
    CollectiveInfo info;  // info.seq == 0: an unused slot
    std::string label;
    int64_t enqueued_us = 0, started_us = 0, ended_us = 0;  // system clock, 0: not yet
    bool ok = false;
    int thread = 0;  // Linux thread id of the thread that ran it
  };
  Entry* slot(int64_t seq);  // the entry of seq, or null once it was overwritten
  const Entry* slot(int64_t seq) const;

  const std::string group_;
  const std::string backend_;
  const int rank_;
  const int size_;
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
};

// Writes every live recorder of this process to <dir>/rank<R>.json with the reason ("timeout
// in allreduce(f32[1000]) #12", "SIGUSR1"). Returns the file's path, or "" when recording is
// off, no group exists, or the file cannot be written (diagnostics never throw).
std::string dump_flight_records(const std::string& reason);

}  // namespace dpar::dist::detail
