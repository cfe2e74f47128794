// Connecting a group: a rank that never comes is named, and an abort or a cancellation stops
// a connect in progress instead of waiting out the timeout.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "catch2/catch.hpp"
#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"

using namespace dpar;
using namespace dpar::dist;

namespace {

ProcessGroupOptions test_options(Millis timeout) {
  ProcessGroupOptions o;
  o.timeout = timeout;
  return o;
}

// Rank 0 of 2 of the job "pgtest" at server; rank 1 never comes in these tests.
std::shared_ptr<StoreClient> rank0_client(const StoreServer& server) {
  StoreClientOptions options;
  options.log_waiting = false;
  options.connect_timeout = std::chrono::seconds(20);
  return std::make_shared<StoreClient>(server.endpoint(), StoreIdentity{"pgtest", 2, 0}, options);
}

}  // namespace

TEST_CASE("rendezvous: a rank that never joins is named", "[process_group]") {
  StoreServer server("127.0.0.1", 0, "pgtest", 2);
  auto store = rank0_client(server);
  CHECK_THROWS_WITH(make_gloo_group(store, 0, 2, test_options(std::chrono::seconds(1))),
                    Catch::Contains("rank 0 (world size 2) could not connect") &&
                        Catch::Contains("rank 1 did not join"));
}

TEST_CASE("Group::abort stops a connect waiting for a rank that never comes", "[process_group]") {
  // Rank 1 never joins. Before, abort() waited for the connect (which held the group's lock)
  // and the connect waited out its timeout: an elastic job whose member died between forming
  // a round and connecting its group waited DPAR_TIMEOUT.
  StoreServer server("127.0.0.1", 0, "pgtest", 2);
  Group group(rank0_client(server), 0, 2, test_options(std::chrono::seconds(120)));
  std::string error;
  std::thread connecting([&] {
    try {
      group.barrier();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  group.abort("rank 1 sent no heartbeat");
  connecting.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_THAT(error, Catch::Contains("rank 0 (world size 2) stopped connecting to the other "
                                    "ranks: the group was aborted: rank 1 sent no heartbeat"));
  CHECK(seconds < 60);  // within a poll slice (0.2 s) in practice; the timeout is 120 s
  // Afterwards the group refuses work with the same reason.
  CHECK_THROWS_WITH(group.barrier(), Catch::Contains("the group was aborted: rank 1 sent no "
                                                     "heartbeat"));
}

TEST_CASE("cancel_connect ends a Gloo connect with its reason", "[process_group]") {
  StoreServer server("127.0.0.1", 0, "pgtest", 2);
  ProcessGroupOptions options = test_options(std::chrono::seconds(120));
  std::atomic<bool> cancel{false};
  options.cancel_connect = [&] { return cancel ? std::string("the job moved on") : ""; };
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel = true;
  });
  CHECK_THROWS_WITH(make_gloo_group(rank0_client(server), 0, 2, options),
                    Catch::Contains("rank 0 (world size 2) stopped connecting to the other "
                                    "ranks: the job moved on"));
  canceller.join();
}
