// dpar-launch's verdict from the ranks' flight records (launch/flight_verdict.h).
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "catch2/catch.hpp"
#include "flight_verdict.h"

using namespace dpar::launch;
using Catch::Contains;

namespace {

FlightEntry entry(int64_t seq, const std::string& call, const std::string& state,
                  int64_t started_us = 0, const std::string& label = "") {
  return FlightEntry{seq, call, label, state, started_us};
}

FlightRecord record(int rank, std::vector<FlightEntry> entries, int64_t time_us = 5'000'000,
                    const std::string& group = "gloo/1") {
  FlightRecord r;
  r.rank = rank;
  r.reason = "SIGUSR1";
  r.time_us = time_us;
  r.groups.push_back(FlightGroup{group, 2, std::move(entries)});
  return r;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& line : lines) all += line + "\n";
  return all;
}

}  // namespace

TEST_CASE("flight verdict: different calls at one position are named first", "[launch]") {
  const auto lines = flight_verdict(
      {record(0, {entry(1, "barrier()", "completed"), entry(2, "allreduce(f32[1000])", "started")}),
       record(1, {entry(1, "barrier()", "completed"), entry(2, "allreduce(f32[999])", "failed")})},
      2, {});
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] ==
        "ranks disagree at #2 of gloo/1: rank 0 called allreduce(f32[1000]); rank 1 called "
        "allreduce(f32[999])");
}

TEST_CASE("flight verdict: the rank behind and the ranks waiting for it", "[launch]") {
  const auto lines = flight_verdict(
      {record(0, {entry(2, "allreduce(f32[4])", "completed"),
                  entry(3, "allreduce(f32[4])", "started", 3'000'000, "DataParallel bucket 0")}),
       record(1, {entry(2, "allreduce(f32[4])", "completed")}),
       record(2, {entry(3, "allreduce(f32[4])", "started", 4'000'000, "DataParallel bucket 0")})},
      3, {});
  INFO(joined(lines));
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] ==
        "in gloo/1, rank 1 is behind: its last collective is allreduce(f32[4]) #2 (completed)");
  CHECK(lines[1] ==
        "ranks 0, 2 wait in allreduce(f32[4]) #3 (DataParallel bucket 0) of gloo/1 (for 2.0 s "
        "when recorded)");
}

TEST_CASE("flight verdict: ranks without a record, and what the launcher knows of them",
          "[launch]") {
  auto lines = flight_verdict({record(0, {entry(7, "allreduce(f32[853])", "failed", 1'000'000)})},
                              2, {{1, "stopped (SIGSTOP or a debugger), pid 42"}});
  INFO(joined(lines));
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "rank 0 waits in allreduce(f32[853]) #7 of gloo/1 (for 4.0 s when recorded)");
  CHECK(lines[1] ==
        "rank 1 left no flight record (stopped (SIGSTOP or a debugger), pid 42): the ranks in "
        "gloo/1 may be waiting for it");

  lines = flight_verdict({}, 2, {{1, "was killed by signal 9 (SIGKILL)"}});
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "no rank left a flight record (rank 1: was killed by signal 9 (SIGKILL))");
}

TEST_CASE("flight verdict: every collective finished, or a world of one", "[launch]") {
  auto lines = flight_verdict({record(0, {entry(5, "barrier()", "completed")}),
                               record(1, {entry(5, "barrier()", "completed")})},
                              2, {});
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] ==
        "every rank finished its last collective in gloo/1 (#5): the failure lies outside the "
        "collectives");
  // Every rank stuck in the same collective: nobody behind, the collective itself is the issue.
  lines = flight_verdict({record(0, {entry(5, "barrier()", "started", 4'000'000)}),
                          record(1, {entry(5, "barrier()", "started", 4'500'000)})},
                         2, {});
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("ranks 0, 1 wait in barrier() #5 of gloo/1") &&
                           Contains("the collective itself is stuck or failed"));
  // A world of one has no one to wait for: nothing to say about its group.
  lines = flight_verdict({record(0, {entry(1, "barrier()", "started")}, 1, "gloo/local")}, 1, {});
  REQUIRE(lines.empty());
}

TEST_CASE("flight records are read from the folder; a broken one is reported", "[launch]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dpar-verdict-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "rank1.json") << R"json({"version": 1, "rank": 1, "reason": "SIGUSR1",
    "time_us": 10, "groups": [{"group": "gloo/1", "size": 2, "entries": [
      {"seq": 2, "call": "barrier()", "label": "", "state": "started", "started_us": 4},
      {"seq": 1, "call": "barrier()", "label": "", "state": "completed", "started_us": 1}]}]})json";
  std::ofstream(dir / "rank0.json") << "{\"rank\": 0, \"groups\": [";  // cut short
  std::ofstream(dir / "notes.txt") << "not a record";
  std::vector<std::string> problems;
  const auto records = read_flight_records(dir.string(), &problems);
  REQUIRE(records.size() == 1);
  CHECK(records[0].rank == 1);
  REQUIRE(records[0].groups.size() == 1);
  REQUIRE(records[0].groups[0].entries.size() == 2);
  CHECK(records[0].groups[0].entries[0].seq == 1);  // sorted by seq
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Contains("rank0.json: unreadable flight record"));
  CHECK(read_flight_records((dir / "missing").string(), &problems).empty());
  fs::remove_all(dir);
}
