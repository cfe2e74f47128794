// Rendezvous store: a real gRPC StoreServer on loopback and StoreClients on threads.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "dpar/core/error.h"
#include "dpar/distributed/store.h"
#include "unit/helpers.h"

using namespace dpar;
using namespace dpar::dist;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;
using std::chrono::steady_clock;

namespace {

constexpr char kHost[] = "127.0.0.1";

StoreClientOptions quick_options() {
  StoreClientOptions o;
  o.connect_timeout = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(5);
  o.log_waiting = false;
  return o;
}

std::unique_ptr<StoreClient> client_for(const StoreServer& server, const std::string& job,
                                        int world, int rank,
                                        StoreClientOptions o = quick_options()) {
  return std::make_unique<StoreClient>(server.endpoint(), StoreIdentity{job, world, rank}, o);
}

Bytes b(const std::string& s) { return Store::to_bytes(s); }
std::string s(const Bytes& v) { return Store::to_string(v); }

double seconds_since(steady_clock::time_point t0) {
  return std::chrono::duration<double>(steady_clock::now() - t0).count();
}

// Runs fn on a thread and returns what it threw ("" when it returned normally).
std::future<std::string> error_of_async(std::function<void()> fn) {
  return std::async(std::launch::async, [fn = std::move(fn)]() -> std::string {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  });
}

}  // namespace

TEST_CASE("store: set, get, add, check and binary values", "[store]") {
  StoreServer server(kHost, 0, "job", 2);
  REQUIRE(server.port() > 0);
  CHECK(server.endpoint() == "127.0.0.1:" + std::to_string(server.port()));
  auto c0 = client_for(server, "job", 2, 0);
  auto c1 = client_for(server, "job", 2, 1);
  CHECK(c0->endpoint() == server.endpoint());

  c0->set("addr/0", b("10.0.0.1:6170"));
  CHECK(s(c1->get("addr/0")) == "10.0.0.1:6170");
  c1->set("addr/0", b("overwritten"));
  CHECK(s(c0->get("addr/0")) == "overwritten");

  CHECK(c0->add("counter", 5) == 5);
  CHECK(c1->add("counter", -2) == 3);
  CHECK(s(c0->get("counter")) == "3");  // add values are decimal text
  c0->set("text", b("abc"));
  CHECK_THROWS_WITH(c0->add("text", 1), Contains("not an integer"));

  CHECK(c0->check({"addr/0", "counter"}));
  CHECK_FALSE(c0->check({"addr/0", "absent"}));
  CHECK(c0->check({}));

  Bytes binary(1 << 20);
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<uint8_t>(i * 7);
  binary[3] = 0;
  c0->set("blob", binary);
  CHECK(c1->get("blob") == binary);
  c0->set("empty", {});
  CHECK(c1->get("empty").empty());
  CHECK(c1->check({"empty"}));
}

TEST_CASE("store: compare_set semantics", "[store]") {
  StoreServer server(kHost, 0, "job", 1);
  auto c = client_for(server, "job", 1, 0);
  // Absent key + empty expected: set it.
  CHECK(s(c->compare_set("k", {}, b("first"))) == "first");
  // Present key + empty expected: no change, current value returned.
  CHECK(s(c->compare_set("k", {}, b("second"))) == "first");
  // Wrong expected: no change.
  CHECK(s(c->compare_set("k", b("nope"), b("second"))) == "first");
  // Matching expected: swapped.
  CHECK(s(c->compare_set("k", b("first"), b("second"))) == "second");
  CHECK(s(c->get("k")) == "second");
  // Absent key + non-empty expected: stays absent (empty result).
  CHECK(c->compare_set("other", b("x"), b("y")).empty());
  CHECK_FALSE(c->check({"other"}));
}

TEST_CASE("store: concurrent adds from 4 clients sum correctly", "[store]") {
  constexpr int kWorld = 4, kAdds = 200;
  StoreServer server(kHost, 0, "job", kWorld);
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> seen(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto c = client_for(server, "job", kWorld, r);
      for (int i = 0; i < kAdds; ++i) seen[r].push_back(c->add("sum", 1));
    });
  }
  for (auto& t : threads) t.join();
  auto c = client_for(server, "job", kWorld, 0);
  CHECK(c->add("sum", 0) == kWorld * kAdds);
  // Every intermediate value was handed out exactly once: the adds were atomic.
  std::vector<int64_t> all;
  for (auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  for (int i = 0; i < kWorld * kAdds; ++i) REQUIRE(all[i] == i + 1);
}

TEST_CASE("store: get and wait block until another rank sets the key", "[store]") {
  StoreServer server(kHost, 0, "job", 2);
  auto c0 = client_for(server, "job", 2, 0);
  auto c1 = client_for(server, "job", 2, 1);
  const auto t0 = steady_clock::now();
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c1->set("late", b("value"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c1->set("later", b("value2"));
  });
  CHECK(s(c0->get("late")) == "value");
  CHECK(seconds_since(t0) > 0.25);
  c0->wait({"late", "later"}, std::chrono::seconds(5));
  CHECK(seconds_since(t0) > 0.35);
  CHECK(seconds_since(t0) < 3.0);
  writer.join();
  c0->wait({"late", "later"});  // already there: returns at once
}

TEST_CASE("store: timeouts name the missing keys and the endpoint", "[store][errors]") {
  StoreServer server(kHost, 0, "job", 1);
  auto c = client_for(server, "job", 1, 0);
  c->set("a", b("1"));
  const auto t0 = steady_clock::now();
  CHECK_THROWS_WITH(c->wait({"a", "b", "c"}, std::chrono::milliseconds(300)),
                    StartsWith("timed out after 0.3 s waiting for keys 'b', 'c' in the "
                               "rendezvous store at " +
                               server.endpoint()));
  CHECK(seconds_since(t0) < 2.0);
  c->set_timeout(std::chrono::milliseconds(200));
  CHECK_THROWS_WITH(c->get("never"), StartsWith("timed out after 0.2 s waiting for key 'never' "
                                                "in the rendezvous store at " +
                                                server.endpoint()));
}

TEST_CASE("store: unreachable rank 0 prints waiting lines, then a clear error", "[store][errors]") {
  const int port = free_port();
  const std::string ep = std::string(kHost) + ":" + std::to_string(port);
  std::mutex mu;
  std::vector<std::string> lines;
  StoreClientOptions o;
  o.connect_timeout = std::chrono::milliseconds(1200);
  o.log_interval = std::chrono::milliseconds(300);
  o.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(line);
  };
  const auto t0 = steady_clock::now();
  CHECK_THROWS_WITH(StoreClient(ep, {"job", 2, 1}, o),
                    StartsWith("could not reach the rendezvous store of rank 0 at " + ep +
                               " after 1.2 s (is rank 0 running? is the address/port right?)"));
  const double took = seconds_since(t0);
  CHECK(took > 1.1);
  CHECK(took < 3.0);
  REQUIRE(lines.size() >= 2);
  CHECK(lines.size() <= 4);
  // The line names the time actually waited: at least one log interval, later when the first
  // attempt itself runs late (as under ThreadSanitizer on a loaded machine).
  const std::string prefix = "waiting for rank 0 at " + ep + " (";
  REQUIRE_THAT(lines[0], StartsWith(prefix) && EndsWith(" s)"));
  const double first_wait = std::stod(lines[0].substr(prefix.size()));
  CHECK(first_wait >= 0.3);
  CHECK(first_wait <= took);

  // log_waiting=false keeps quiet.
  lines.clear();
  o.log_waiting = false;
  o.connect_timeout = std::chrono::milliseconds(400);
  CHECK_THROWS_AS(StoreClient(ep, {"job", 2, 1}, o), Error);
  CHECK(lines.empty());

  CHECK_THROWS_WITH(StoreClient("127.0.0.1", {"job", 1, 0}, o),
                    Contains("bad endpoint '127.0.0.1' (expected <ip>:<port>)"));
  CHECK_THROWS_WITH(StoreClient("127.0.0.1:99999", {"job", 1, 0}, o), Contains("bad endpoint"));
}

TEST_CASE("store: a client waits for a rank 0 that starts late", "[store]") {
  const int port = free_port();
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    server = std::make_unique<StoreServer>(kHost, port, "job", 2);
  });
  auto o = quick_options();
  StoreClient c(std::string(kHost) + ":" + std::to_string(port), {"job", 2, 1}, o);
  starter.join();
  c.set("k", b("v"));
  CHECK(s(c.get("k")) == "v");
}

TEST_CASE("store: a client of another job or world size is refused", "[store][errors]") {
  StoreServer server(kHost, 0, "a", 4);
  const std::string ep = server.endpoint();
  CHECK_THROWS_WITH(client_for(server, "b", 2, 0),
                    StartsWith("refused by the store at " + ep +
                               ": it serves job 'a' with world size 4, this process is job 'b' "
                               "with world size 2"));
  CHECK_THROWS_WITH(client_for(server, "a", 2, 1),
                    StartsWith("refused by the store at " + ep +
                               ": it serves job 'a' with world size 4, this process is job 'a' "
                               "with world size 2"));
  CHECK_THROWS_WITH(StoreClient(ep, {"a", 4, 4}, quick_options()),
                    Contains("rank 4 is outside world size 4"));
  auto ok = client_for(server, "a", 4, 3);
  ok->set("x", b("1"));
}

TEST_CASE("store: a stale client of an older job is refused by the new job's store",
          "[store][errors]") {
  auto old_server = std::make_unique<StoreServer>(kHost, 0, "old", 2);
  const int port = old_server->port();
  auto stale = client_for(*old_server, "old", 2, 1);
  stale->set("k", b("old"));
  old_server.reset();
  StoreServer new_server(kHost, port, "new", 2);
  // The stale channel reconnects on its next call; until it has, calls report the lost store.
  std::string error;
  const auto t0 = steady_clock::now();
  do {
    try {
      stale->set("k", b("stale"));
      error.clear();
    } catch (const Error& e) {
      error = e.what();
    }
    if (error.find("lost the rendezvous store") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (seconds_since(t0) < 5.0);
  CHECK_THAT(error, StartsWith("refused by the store at " + new_server.endpoint() +
                               ": it serves job 'new' with world size 2, this process is job "
                               "'old' with world size 2"));
  auto fresh = client_for(new_server, "new", 2, 0);
  CHECK_FALSE(fresh->check({"k"}));
}

TEST_CASE("store: a port in use or a bad address is an error naming host:port", "[store][errors]") {
  StoreServer first(kHost, 0, "job", 1);
  const std::string ep = first.endpoint();
  CHECK_THROWS_WITH(
      StoreServer(kHost, first.port(), "job", 1),
      StartsWith("rendezvous store: cannot listen on " + ep + ": address already in use"));
  CHECK_THROWS_WITH(StoreServer(kHost, 70000, "job", 1),
                    StartsWith("rendezvous store: cannot listen on 127.0.0.1:70000: port out of "
                               "range"));
  // The first server is unaffected.
  auto c = client_for(first, "job", 1, 0);
  c->set("k", b("v"));
}

TEST_CASE("store: shutdown wakes blocked waiters with an error, later calls fail fast",
          "[store][errors]") {
  StoreServer server(kHost, 0, "job", 2);
  const std::string ep = server.endpoint();
  auto c0 = client_for(server, "job", 2, 0);
  auto c1 = client_for(server, "job", 2, 1);
  c0->set_timeout(std::chrono::seconds(20));
  auto get_error = error_of_async([&] { c0->get("never"); });
  auto wait_error = error_of_async([&] { c1->wait({"never"}, std::chrono::seconds(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = steady_clock::now();
  server.shutdown();
  CHECK(seconds_since(t0) < 3.0);
  REQUIRE(get_error.wait_for(std::chrono::seconds(3)) == std::future_status::ready);
  REQUIRE(wait_error.wait_for(std::chrono::seconds(3)) == std::future_status::ready);
  CHECK_THAT(get_error.get(), StartsWith("the rendezvous store at " + ep +
                                         " shut down during get 'never' (did rank 0 exit?)"));
  CHECK_THAT(wait_error.get(), StartsWith("the rendezvous store at " + ep + " shut down"));
  server.shutdown();  // idempotent

  // The server is gone: calls fail naming the endpoint instead of hanging.
  const auto t1 = steady_clock::now();
  CHECK_THROWS_WITH(c0->set("k", b("v")), Contains(ep));
  CHECK_THROWS_WITH(c1->get("k"), Contains(ep));
  CHECK(seconds_since(t1) < 3.0);
}

TEST_CASE("store: PrefixStore namespaces keys per group", "[store]") {
  StoreServer server(kHost, 0, "job", 1);
  std::shared_ptr<Store> base = client_for(server, "job", 1, 0);
  PrefixStore g0("pg0", base), g1("pg1", base);
  g0.set("rank0", b("zero"));
  g1.set("rank0", b("one"));
  CHECK(s(g0.get("rank0")) == "zero");
  CHECK(s(g1.get("rank0")) == "one");
  CHECK(s(base->get("pg0/rank0")) == "zero");
  CHECK(g0.add("n", 2) == 2);
  CHECK(g1.add("n", 5) == 5);
  CHECK(g0.check({"rank0", "n"}));
  CHECK_FALSE(g0.check({"only1"}));
  g1.set("only1", b("x"));
  CHECK_FALSE(g0.check({"only1"}));
  CHECK(s(g1.compare_set("only1", b("x"), b("y"))) == "y");
  CHECK(s(g0.compare_set("only1", {}, b("z"))) == "z");
  CHECK(s(g1.get("only1")) == "y");
  g0.wait({"rank0", "n", "only1"}, std::chrono::seconds(1));
  CHECK_THROWS_WITH(g1.wait({"rank0", "missing"}, std::chrono::milliseconds(200)),
                    Contains("waiting for key 'pg1/missing'"));
  // A view keeps its own timeout for get.
  g1.set_timeout(std::chrono::milliseconds(200));
  const auto t0 = steady_clock::now();
  CHECK_THROWS_WITH(g1.get("absent"), Contains("'pg1/absent'"));
  CHECK(seconds_since(t0) < 2.0);
  // Nested prefixes compose.
  PrefixStore nested("sub", std::make_shared<PrefixStore>("pg0", base));
  nested.set("k", b("v"));
  CHECK(s(base->get("pg0/sub/k")) == "v");
  CHECK_THROWS_AS(PrefixStore("x", nullptr), Error);
}
