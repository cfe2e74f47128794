// EtcdStore against real etcd members (Debian's etcd-server) on loopback: the Store contract,
// leases as heartbeats, and a member's death under a running client.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <numeric>
#include <thread>

#include "dpar/distributed/elastic.h"
#include "dpar/distributed/etcd_store.h"
#include "unit/etcd_cluster.h"

using namespace dpar;
using namespace dpar::dist;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using Clock = std::chrono::steady_clock;

namespace {

Bytes b(const std::string& s) { return Store::to_bytes(s); }
std::string s(const Bytes& v) { return Store::to_string(v); }

EtcdStoreOptions quick() {
  EtcdStoreOptions o;
  o.connect_timeout = std::chrono::seconds(20);  // the members elect a leader first
  o.timeout = std::chrono::seconds(5);
  o.rpc_timeout = std::chrono::seconds(10);
  o.lease_ttl = std::chrono::seconds(2);
  return o;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("etcd store: set, get, add, compare_set, check and wait keep the Store contract",
          "[etcd]") {
  EtcdCluster etcd(1);
  EtcdStore store(etcd.endpoint(0), "job-a", quick());
  store.erase_job();

  store.set("k", b("v1"));
  CHECK(s(store.get("k")) == "v1");
  CHECK(store.check({"k"}));
  CHECK_FALSE(store.check({"k", "absent"}));

  CHECK(store.add("counter", 5) == 5);
  CHECK(store.add("counter", -2) == 3);
  CHECK(s(store.get("counter")) == "3");
  CHECK_THAT(error_of([&] { store.add("k", 1); }),
             Contains("'k' holds a value that is not an integer"));

  // An empty expected value means "absent"; the value after the operation comes back.
  CHECK(s(store.compare_set("cas", {}, b("first"))) == "first");
  CHECK(s(store.compare_set("cas", {}, b("second"))) == "first");
  CHECK(s(store.compare_set("cas", b("first"), b("third"))) == "third");
  CHECK(s(store.compare_set("cas", b("nope"), b("x"))) == "third");
  CHECK(store.compare_set("none", b("x"), b("y")).empty());

  const auto t0 = Clock::now();
  CHECK_THAT(
      error_of([&] {
        store.wait({"k", "missing-1", "missing-2"}, std::chrono::milliseconds(700));
      }),
      Contains("timed out after 0.7 s waiting for keys 'missing-1', 'missing-2' in etcd at " +
               etcd.endpoint(0)));
  CHECK(seconds_since(t0) < 5.0);

  // Another job id sees none of it; erase_job() clears only its own job.
  EtcdStore other(etcd.endpoint(0), "job-b", quick());
  CHECK_FALSE(other.check({"k"}));
  other.set("k", b("b's"));
  store.erase_job();
  CHECK_FALSE(store.check({"k"}));
  CHECK(s(other.get("k")) == "b's");
}

TEST_CASE("etcd store: get waits for another client's set; add is atomic across clients",
          "[etcd]") {
  EtcdCluster etcd(1);
  EtcdStore reader(etcd.endpoint(0), "job", quick());
  reader.erase_job();
  auto value = std::async(std::launch::async, [&] { return s(reader.get("late")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EtcdStore writer(etcd.endpoint(0), "job", quick());
  writer.set("late", b("here"));
  REQUIRE(value.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK(value.get() == "here");

  // Four clients, 40 adds each: no lost update, every intermediate value handed out once.
  std::vector<std::unique_ptr<EtcdStore>> clients;
  for (int i = 0; i < 4; ++i)
    clients.push_back(std::make_unique<EtcdStore>(etcd.endpoint(0), "job", quick()));
  std::vector<std::future<std::vector<int64_t>>> results;
  for (auto& c : clients) {
    results.push_back(std::async(std::launch::async, [&c] {
      std::vector<int64_t> seen;
      for (int i = 0; i < 40; ++i) seen.push_back(c->add("arrivals", 1));
      return seen;
    }));
  }
  std::vector<int64_t> all;
  for (auto& r : results)
    for (int64_t v : r.get()) all.push_back(v);
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(160);
  std::iota(expected.begin(), expected.end(), 1);
  CHECK(all == expected);
}

TEST_CASE("etcd store: a leased key goes when its client is stopped or gone, stays while it lives",
          "[etcd]") {
  EtcdCluster etcd(1);
  // The child connects before this process has touched gRPC (each test case is its own
  // process under ctest), sets its heartbeat and stops itself, as a SIGSTOPped rank would be.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      EtcdStore store(etcd.endpoint(0), "job", quick());
      store.set_leased("hb/child", b("1"));
      raise(SIGSTOP);
    } catch (...) {
    }
    _exit(0);
  }
  EtcdStore watcher(etcd.endpoint(0), "job", quick());
  watcher.wait({"hb/child"}, std::chrono::seconds(20));
  int status = 0;
  REQUIRE(waitpid(child, &status, WUNTRACED) == child);
  REQUIRE(WIFSTOPPED(status));
  const auto stopped = Clock::now();

  // This client's own leased key outlives several time-to-lives: the keeper renews it.
  watcher.set_leased("hb/watcher", b("1"));
  while (watcher.check({"hb/child"}) && seconds_since(stopped) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double gone_after = seconds_since(stopped);
  CHECK_FALSE(watcher.check({"hb/child"}));
  CHECK(gone_after >= 1.0);  // the 2 s lease, less the time the child took to stop
  CHECK(gone_after < 6.0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  CHECK(watcher.check({"hb/watcher"}));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);

  // A client that closes revokes its lease: its keys go at once.
  {
    EtcdStore brief(etcd.endpoint(0), "job", quick());
    brief.set_leased("hb/brief", b("1"));
    CHECK(watcher.check({"hb/brief"}));
  }
  CHECK_FALSE(watcher.check({"hb/brief"}));
}

TEST_CASE("etcd store: the member a client talks to dies and the client goes on with the others",
          "[etcd]") {
  EtcdCluster etcd(3);
  // Member 0 first in the list: every client here is connected to it.
  EtcdStore a(etcd.endpoints(), "job", quick());
  EtcdStore b_store(etcd.endpoints(), "job", quick());
  b_store.set_timeout(std::chrono::seconds(20));
  a.erase_job();
  a.set("before", b("1"));
  a.set_leased("hb/a", b("1"));
  CHECK(a.add("n", 1) == 1);
  auto waiting = std::async(std::launch::async, [&] { return s(b_store.get("after")); });

  etcd.kill(0);
  const auto t0 = Clock::now();
  a.set("after", b("2"));  // through member 1 or 2, once the channel moved (and a leader is there)
  CHECK(seconds_since(t0) < 8.0);
  CHECK(a.add("n", 1) == 2);
  CHECK(s(b_store.get("before")) == "1");
  REQUIRE(waiting.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(waiting.get() == "2");
  // The lease lives on (renewed through the remaining members) for several time-to-lives.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  CHECK(b_store.check({"hb/a"}));

  // Without a quorum the store says it is lost, naming the endpoints; it does not hang.
  etcd.kill(1);
  const auto t1 = Clock::now();
  CHECK_THAT(
      error_of([&] { a.set("no-quorum", b("x")); }),
      StartsWith("lost the etcd cluster at " + etcd.endpoints() + " during set 'no-quorum'"));
  CHECK(seconds_since(t1) < 15.0);
}

TEST_CASE("etcd store: no member at the endpoint is one clear error after connect_timeout",
          "[etcd]") {
  EtcdStoreOptions o = quick();
  o.connect_timeout = std::chrono::milliseconds(800);
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const auto t0 = Clock::now();
  CHECK_THAT(error_of([&] { EtcdStore store(endpoint, "job", o); }),
             StartsWith("could not reach etcd at " + endpoint +
                        " after 0.8 s (is etcd running there? Deadline Exceeded)"));
  CHECK(seconds_since(t0) < 5.0);
  CHECK_THAT(error_of([&] { EtcdStore store("127.0.0.1:1,name:2", "job", o); }),
             Contains("a list of etcd members takes IPv4 addresses"));
  CHECK_THAT(error_of([&] { EtcdStore store("127.0.0.1", "job", o); }), Contains("bad endpoint"));
  CHECK_THAT(error_of([&] { EtcdStore store(endpoint, "a/b", o); }), Contains("without '/'"));
}

TEST_CASE("etcd store: an elastic job refuses a job id that already finished in etcd", "[etcd]") {
  EtcdCluster etcd(1);
  EtcdStore store(etcd.endpoint(0), "done-job", quick());
  store.set("elastic/finished", b("1"));
  ElasticOptions options;
  options.backend = "etcd";
  options.endpoint = etcd.endpoint(0);
  options.job_id = "done-job";
  options.elastic_timeout = std::chrono::seconds(20);
  CHECK_THAT(error_of([&] { ElasticJob job(options); }),
             StartsWith("elastic: job 'done-job' already finished in etcd at " + etcd.endpoint(0) +
                        "; give this job its own --rdzv_id (DPAR_RDZV_ID), or delete the old "
                        "one's keys: etcdctl del --prefix /dpar/done-job/"));
  options.backend = "zk";
  CHECK_THAT(error_of([&] { ElasticJob job(options); }),
             Contains("rendezvous backend 'zk' (DPAR_RDZV_BACKEND): expected dpar or etcd"));
}
