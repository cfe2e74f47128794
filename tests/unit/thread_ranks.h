#pragma once
// Ranks as threads of one test process, each with its own StoreClient to one StoreServer on
// 127.0.0.1 (and, in the tests, its own group), exactly as separate processes would meet. Checks
// inside rank threads throw (Catch2's macros are not thread-safe); run_ranks reports every
// rank's failure from the main thread.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"

namespace dpar::test {

using dist::Millis;
using dist::ProcessGroupOptions;
using dist::Store;
using dist::StoreClient;
using dist::StoreClientOptions;
using dist::StoreIdentity;
using dist::StoreServer;

// A check inside a rank thread: throws, and run_ranks reports it.
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

inline ProcessGroupOptions test_options(Millis timeout = std::chrono::seconds(20)) {
  ProcessGroupOptions o;
  o.timeout = timeout;
  return o;
}

inline std::shared_ptr<StoreClient> connect(const StoreServer& server, int rank, int size) {
  StoreClientOptions options;
  options.log_waiting = false;
  options.connect_timeout = std::chrono::seconds(20);
  return std::make_shared<StoreClient>(server.endpoint(), StoreIdentity{"pgtest", size, rank},
                                       options);
}

// Runs body(rank, store) on `size` threads against one fresh store server; fails the test
// with every rank's error.
inline void run_ranks(int size, const std::function<void(int, std::shared_ptr<Store>)>& body) {
  StoreServer server("127.0.0.1", 0, "pgtest", size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, connect(server, r, size));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    INFO("rank " << r << " of " << size);
    CHECK(errors[r] == "");
  }
}

}  // namespace dpar::test
