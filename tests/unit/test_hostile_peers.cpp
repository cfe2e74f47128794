// Hostile peers against the rendezvous store: while a real job uses the store, other clients
// send garbage, truncated HTTP/2, a gRPC message header claiming 4 GiB, hold hundreds of idle
// connections (slowloris) and call with another job's identity. The job must finish with the
// same results, the server log one line naming the peer, and memory stay bounded. Then the
// same for the ports Gloo's pairs listen on during the rendezvous (gloo_mesh.h).
// (The parameter server's version is in test_ps_hostile.cpp.)
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <thread>

#include "dpar/core/error.h"
#include "dpar/core/sysinfo.h"
#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"
#include "dpar/tensor/tensor.h"
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

// ---- Gloo's rendezvous ports ----------------------------------------------------------------

namespace {

// Passes everything to the job's store, but makes the ranks of the first rendezvous attempt
// slow to fetch each other's Gloo addresses: its pairs' ports then stay open for a second
// (instead of milliseconds), long enough for the scanner below to find them.
class SlowFirstAttemptStore final : public Store {
 public:
  explicit SlowFirstAttemptStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  void set(const std::string& key, const Bytes& value) override { inner_->set(key, value); }
  Bytes get(const std::string& key) override {
    linger(key);
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_->compare_set(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    for (const auto& k : keys) linger(k);
    inner_->wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }

 private:
  void linger(const std::string& key) {
    if (key.find("attempt/0/addr/") != std::string::npos && lingered_.insert(key).second)
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  std::shared_ptr<Store> inner_;
  std::set<std::string> lingered_;  // one rank's thread only
};

struct GlooJob {
  std::vector<float> results;
  std::vector<std::string> errors;
  std::vector<std::string> log;
};

// Two ranks make a Gloo group through `wrap(store)` and allreduce [r + 1] x 4.
GlooJob run_gloo_job(const StoreServer& server,
                     const std::function<std::shared_ptr<Store>(std::shared_ptr<Store>)>& wrap) {
  GlooJob job;
  job.results.assign(2, 0.f);
  job.errors.resize(2);
  std::mutex log_mu;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto client = std::make_shared<StoreClient>(
            server.endpoint(), StoreIdentity{"gloojob", 2, r}, quick_options());
        ProcessGroupOptions o;
        o.timeout = std::chrono::seconds(20);
        o.log = [&](const std::string& line) {
          std::lock_guard<std::mutex> lock(log_mu);
          job.log.push_back(line);
        };
        auto group = make_gloo_group(wrap(client), r, 2, o);
        Tensor t = Tensor::full({4}, r + 1.0);
        group->allreduce({t})->wait();
        job.results[static_cast<size_t>(r)] = t.data<float>()[3];
      } catch (const std::exception& e) {
        job.errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return job;
}

}  // namespace

TEST_CASE("gloo: a stranger on a rendezvous port is named and the ranks connect again",
          "[gloo][hostile]") {
  StoreServer server("127.0.0.1", 0, "gloojob", 2);
  const std::set<int> before = test::listening_ports_of_this_process();
  // A scanner: connects to every port this process starts listening on, sends garbage to the
  // first and nothing to the others, and holds the connections until the job is over.
  std::vector<test::RawConnection> held;
  std::atomic<bool> stop{false};
  std::thread scanner([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::set<int> hit;
    while (!stop && hit.size() < 2 && std::chrono::steady_clock::now() < give_up) {
      for (int port : test::listening_ports_of_this_process()) {
        if (before.count(port) || hit.size() == 2 || !hit.insert(port).second) continue;
        held.emplace_back(port);
        if (hit.size() == 1) held.back().send(test::random_bytes(64 << 10, 3));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  const GlooJob job = run_gloo_job(
      server, [](std::shared_ptr<Store> s) { return std::make_shared<SlowFirstAttemptStore>(s); });
  stop = true;
  scanner.join();

  for (const auto& e : job.errors) REQUIRE(e.empty());
  REQUIRE(job.results == std::vector<float>{3.f, 3.f});  // the same sums as an unattacked run
  REQUIRE(held.size() == 2);
  std::string strangers;
  for (const auto& c : held) strangers += " 127.0.0.1:" + std::to_string(c.local_port());
  INFO("the scanner's connections:" << strangers);
  size_t named = 0, retried = 0;
  for (const std::string& line : job.log) {
    INFO(line);
    if (line.find("took a connection from 127.0.0.1:") != std::string::npos) {
      const size_t at = line.find("from ") + 5;
      CHECK_THAT(strangers, Contains(" " + line.substr(at, line.find(' ', at) - at)));
      ++named;
    }
    if (line.find("attempt 1 of 5 failed") != std::string::npos) ++retried;
  }
  CHECK(named == 1);
  CHECK(retried == 1);
  // Once connected, a group listens on nothing: there is no Gloo port left to attack.
  CHECK(test::listening_ports_of_this_process() == before);
}

TEST_CASE("gloo: an unattacked rendezvous logs nothing and leaves no port open",
          "[gloo][hostile]") {
  StoreServer server("127.0.0.1", 0, "gloojob", 2);
  const std::set<int> before = test::listening_ports_of_this_process();
  const GlooJob job = run_gloo_job(server, [](std::shared_ptr<Store> s) { return s; });
  for (const auto& e : job.errors) REQUIRE(e.empty());
  REQUIRE(job.results == std::vector<float>{3.f, 3.f});
  CHECK(job.log.empty());
  CHECK(test::listening_ports_of_this_process() == before);
}
