// The flight recorder (distributed/flight_recorder.h): what a group records per collective,
// the process's JSON file (on a failed collective, on request, on SIGUSR1), and the early stall
// warning. Ranks run as threads of this process against one store server, as in
// test_process_group.cpp.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "distributed/collective_check.h"
#include "distributed/flight_recorder.h"
#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"

using namespace dpar;
using namespace dpar::dist;
using namespace dpar::dist::detail;
namespace fs = std::filesystem;

namespace {

// A fresh folder for the records, named in DPAR_FLIGHT_RECORDER_DIR for the test's length.
struct RecordDir {
  fs::path path = fs::temp_directory_path() /
                  ("dpar-flight-test-" + std::to_string(::getpid()) + "-" +
                   std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  RecordDir() {
    fs::create_directories(path);
    ::setenv("DPAR_FLIGHT_RECORDER_DIR", path.c_str(), 1);
    ::setenv("DPAR_RANK", "7", 1);
  }
  ~RecordDir() {
    ::unsetenv("DPAR_FLIGHT_RECORDER_DIR");
    ::unsetenv("DPAR_RANK");
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path file() const { return path / "rank7.json"; }
};

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The entries of group `name` in a record file.
nlohmann::json group_entries(const nlohmann::json& record, const std::string& name) {
  for (const auto& g : record.at("groups")) {
    if (g.at("group") == name) return g.at("entries");
  }
  return nlohmann::json::array();
}

CollectiveInfo allreduce_of(int64_t numel, int64_t seq) {
  CollectiveInfo info =
      describe_call(CollectiveKind::Allreduce, {Tensor::ones({numel})}, ReduceOp::Sum, 0);
  info.seq = seq;
  return info;
}

}  // namespace

TEST_CASE("flight recorder: states, labels, describe and the ring", "[flight_recorder]") {
  RecordDir dir;
  FlightRecorder recorder("test/ring", "gloo", 0, 2);
  REQUIRE(recorder.enabled());
  recorder.enqueued(allreduce_of(4, 1));
  recorder.started(1);
  recorder.ended(1, true);
  {
    const CollectiveLabel label("DataParallel bucket 3");
    recorder.enqueued(allreduce_of(5, 2));
    {
      const CollectiveLabel inner("inner");
      CHECK(CollectiveLabel::current() == "inner");
    }
    CHECK(CollectiveLabel::current() == "DataParallel bucket 3");
  }
  CHECK(CollectiveLabel::current().empty());
  recorder.started(2);
  recorder.ended(2, false);
  recorder.enqueued(allreduce_of(6, 3));
  recorder.started(3);
  recorder.enqueued(allreduce_of(7, 4));

  CHECK(recorder.describe(1) == "allreduce(f32[4]) #1");
  CHECK(recorder.describe(2) == "allreduce(f32[5]) #2 (DataParallel bucket 3)");
  CHECK(recorder.describe(99) == "#99");
  const nlohmann::json j = recorder.json();
  CHECK(j.at("group") == "test/ring");
  CHECK(j.at("rank") == 0);
  const auto& e = j.at("entries");
  REQUIRE(e.size() == 4);
  CHECK(e[0].at("state") == "completed");
  CHECK(e[1].at("state") == "failed");
  CHECK(e[1].at("label") == "DataParallel bucket 3");
  CHECK(e[2].at("state") == "started");
  CHECK(e[3].at("state") == "queued");
  CHECK(e[3].at("call") == "allreduce(f32[7])");
  CHECK(e[3].at("shape") == nlohmann::json::array({7}));
  CHECK(e[0].at("thread").get<int>() > 0);
  CHECK(e[0].at("ended_us").get<int64_t>() >= e[0].at("started_us").get<int64_t>());
  CHECK(e[0].at("started_us").get<int64_t>() >= e[0].at("enqueued_us").get<int64_t>());

  // The ring keeps the newest entries: seq 1 is gone after capacity more.
  const int64_t capacity = j.at("capacity").get<int64_t>();
  for (int64_t s = 5; s <= capacity + 1; ++s) recorder.enqueued(allreduce_of(1, s));
  CHECK(recorder.size() == static_cast<size_t>(capacity));
  CHECK(recorder.describe(1) == "#1");
  recorder.started(1);  // a late update of an overwritten entry changes nothing
  CHECK(recorder.describe(capacity + 1) == "allreduce(f32[1]) #" + std::to_string(capacity + 1));
}

TEST_CASE("flight recorder: the process's file, on request and on SIGUSR1", "[flight_recorder]") {
  RecordDir dir;
  FlightRecorder recorder("test/file", "gloo", 1, 2);
  recorder.enqueued(allreduce_of(3, 1));
  recorder.started(1);

  const std::string path = dump_flight_records("asked by the test");
  CHECK(path == dir.file().string());
  nlohmann::json record = read_json(dir.file());
  CHECK(record.at("rank") == 7);  // DPAR_RANK
  CHECK(record.at("reason") == "asked by the test");
  CHECK(record.at("pid") == ::getpid());
  const nlohmann::json entries = group_entries(record, "test/file");
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].at("state") == "started");

  // SIGUSR1 (what dpar-launch sends when a rank dies): written by the recorder's own thread.
  fs::remove(dir.file());
  REQUIRE(::raise(SIGUSR1) == 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(dir.file()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(fs::exists(dir.file()));
  record = read_json(dir.file());
  CHECK(record.at("reason") == "SIGUSR1");
  CHECK(group_entries(record, "test/file").size() == 1);
}

TEST_CASE("DPAR_STALL_WARNING and DPAR_FLIGHT_RECORDER_DIR reach the options",
          "[flight_recorder]") {
  CHECK(ProcessGroupOptions{}.stall_warning == std::chrono::seconds(60));
  ::setenv("DPAR_STALL_WARNING", "2.5", 1);
  CHECK(ProcessGroupOptions::from_env().stall_warning == Millis(2500));
  ::setenv("DPAR_STALL_WARNING", "0", 1);
  CHECK(ProcessGroupOptions::from_env().stall_warning == Millis(0));
  ::setenv("DPAR_STALL_WARNING", "later", 1);
  CHECK_THROWS_WITH(ProcessGroupOptions::from_env(),
                    Catch::Contains("DPAR_STALL_WARNING") && Catch::Contains("later"));
  ::unsetenv("DPAR_STALL_WARNING");
}

TEST_CASE("a timed-out collective writes the record; a stall is named before the timeout",
          "[flight_recorder]") {
  RecordDir dir;
  StoreServer server("127.0.0.1", 0, "frtest", 2);
  std::mutex log_mutex;
  std::vector<std::string> log;
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  std::string error0;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        StoreClientOptions client;
        client.log_waiting = false;
        auto store = std::make_shared<StoreClient>(server.endpoint(),
                                                   StoreIdentity{"frtest", 2, rank}, client);
        ProcessGroupOptions options;
        options.timeout = std::chrono::seconds(6);
        options.stall_warning = std::chrono::seconds(1);
        options.log = [&](const std::string& line) {
          std::lock_guard<std::mutex> lock(log_mutex);
          log.push_back(line);
        };
        auto pg = make_gloo_group(store, rank, 2, options);
        pg->allreduce({Tensor::ones({7})})->wait();  // #1 on both ranks
        if (rank == 0) {
          try {
            pg->allreduce({Tensor::ones({7})})->wait();  // #2: rank 1 never calls it
          } catch (const Error& e) {
            error0 = e.what();
          }
          rank0_done.set_value();
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // publishes #1
          done.wait();
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  INFO(error0);
  CHECK_THAT(error0, Catch::Contains("allreduce(f32[7]) #2 timed out after 6 s") &&
                         Catch::Contains("(flight record: " + dir.file().string() + ")"));
  bool warned = false;
  for (const std::string& line : log) {
    warned = warned || (line.find("stall: rank 0 (group gloo/") != std::string::npos &&
                        line.find("in allreduce(f32[7]) #2; ranks that have not arrived: 1 "
                                  "(last entered #1)") != std::string::npos);
  }
  INFO("log: " << (log.empty() ? std::string("(empty)") : log.front()));
  CHECK(warned);
  // Both ranks' groups live in this process: rank 0's #2 failed, rank 1 never issued it.
  const nlohmann::json record = read_json(dir.file());
  CHECK_THAT(record.at("reason").get<std::string>(),
             Catch::Contains("allreduce(f32[7]) #2 timed out"));
  int failed = 0;
  for (const auto& g : record.at("groups")) {
    for (const auto& e : g.at("entries")) failed += e.at("state") == "failed" ? 1 : 0;
  }
  CHECK(failed == 1);
}
