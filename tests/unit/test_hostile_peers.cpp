// Hostile peers against the rendezvous store: while a real job uses the store, other clients
// send garbage, truncated HTTP/2, a gRPC message header claiming 4 GiB, hold hundreds of idle
// connections (slowloris) and call with another job's identity. The job must finish with the
// same results, the server log one line naming the peer, and memory stay bounded.
// (The parameter server's version is in test_ps.cpp, beside its job helpers.)
#include <catch2/catch.hpp>
#include <mutex>
#include <thread>

#include "dpar/core/error.h"
#include "dpar/core/sysinfo.h"
#include "dpar/distributed/store.h"
#include "unit/hostile_peer.h"

using namespace dpar;
using namespace dpar::dist;
using Catch::Matchers::Contains;

namespace {

constexpr int kClients = 2;
constexpr int kRounds = 100;

StoreClientOptions quick_options() {
  StoreClientOptions o;
  o.connect_timeout = std::chrono::seconds(10);
  o.timeout = std::chrono::seconds(30);
  o.log_waiting = false;
  return o;
}

// "r<rank>/<i>" (built with append: GCC 12's -Wrestrict misfires on "r" + to_string(...)).
std::string key_of(int rank, int i) {
  std::string key = "r";
  key.append(std::to_string(rank)).append("/").append(std::to_string(i));
  return key;
}

// The real job: each rank publishes keys, bumps a shared counter and reads the other's keys.
// Returns what it read, which must not depend on anything the attackers do.
std::vector<std::string> run_job(const std::string& endpoint, int run) {
  std::vector<std::string> seen(kClients);
  std::vector<std::string> errors(kClients);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kClients; ++r) {
    ranks.emplace_back([&, r] {
      try {
        StoreClient store(endpoint, StoreIdentity{"job", kClients, r}, quick_options());
        for (int i = 0; i < kRounds; ++i) {
          const std::string v = std::to_string(r * 1000 + i);
          store.set(key_of(r, i), Bytes(v.begin(), v.end()));
          store.add("counter", 1);
        }
        const int peer = 1 - r;
        for (int i = 0; i < kRounds; i += 7) {
          const Bytes b = store.get(key_of(peer, i));
          seen[static_cast<size_t>(r)] += std::string(b.begin(), b.end()) + ",";
        }
        // Both ranks' adds are in once both have said so.
        const std::string done = "done" + std::to_string(run) + "/";
        store.set(done + std::to_string(r), Bytes{'1'});
        store.wait({done + "0", done + "1"});
        seen[static_cast<size_t>(r)] += std::to_string(store.add("counter", 0));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) REQUIRE(e.empty());
  return seen;
}

}  // namespace

TEST_CASE("store: hostile peers cannot crash, stall or bloat the server", "[store][hostile]") {
  std::mutex log_mu;
  std::vector<std::string> log;
  StoreServer server("127.0.0.1", 0, "job", kClients, [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(log_mu);
    log.push_back(line);
  });
  const std::vector<std::string> expected = run_job(server.endpoint(), 0);
  REQUIRE_THAT(expected[0], Contains(",200"));
  // Steady state: the job once more (new keys overwrite the same ones), then measure.
  (void)run_job(server.endpoint(), 1);
  const double steady_mb = sysinfo::current_rss_mb();

  std::vector<std::string> attacked;
  {
    // 300 slowloris connections held open, and garbage, a 4 GiB message header and another
    // job's identity, in a loop while the job runs three more times.
    test::Attack attack({server.port()}, 300, [&] {
      test::send_garbage(server.port());
      test::RawConnection(server.port())
          .send(test::grpc_call_claiming("/dpar.rpc.store.KeyValueStore/Set", 0xffffffffu));
      try {
        StoreClientOptions o = quick_options();
        o.connect_timeout = std::chrono::seconds(2);
        StoreClient intruder(server.endpoint(), StoreIdentity{"other-job", kClients, 0}, o);
        intruder.set("r0/0", Bytes{'x'});
      } catch (const Error&) {
      }
    });
    for (int run = 2; run < 5; ++run) attacked = run_job(server.endpoint(), run);
  }

  // Same answers, with the counter 2 x kRounds higher per run.
  REQUIRE(attacked[0].substr(0, attacked[0].rfind(',')) ==
          expected[0].substr(0, expected[0].rfind(',')));
  REQUIRE(attacked[1].substr(0, attacked[1].rfind(',')) ==
          expected[1].substr(0, expected[1].rfind(',')));
  REQUIRE_THAT(attacked[0], Contains("," + std::to_string(5 * kClients * kRounds)));
  {
    std::lock_guard<std::mutex> lock(log_mu);
    REQUIRE(log.size() == 1);  // every intruder came from 127.0.0.1: one line
    REQUIRE_THAT(log[0], Contains("refused a call from 127.0.0.1:") && Contains("other-job"));
  }
  if (test::kMeasureMemory) {
    const double grown = sysinfo::current_rss_mb() - steady_mb;
    INFO("resident set grew by " << grown << " MiB under attack");
    REQUIRE(grown <= test::kMaxGrowthMb);
  }
  // And the server still answers new clients.
  StoreClient late(server.endpoint(), StoreIdentity{"job", kClients, 0}, quick_options());
  REQUIRE(late.add("counter", 0) == 5 * kClients * kRounds);
}
