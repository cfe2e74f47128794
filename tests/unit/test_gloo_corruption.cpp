// Bytes corrupted on a Gloo connection mid-job: a proxy sits on the connection between the two
// ranks of a Gloo group and flips one byte in the middle of a tensor payload. Gloo carries no
// checksum of its own; dpar's checked rings and broadcast must notice, fail the collective on the
// rank that received the bytes with an error naming the op, the ranks and the CRC-32C, and leave
// no rank with a silently wrong result. (The parameter server's version is in
// test_ps_hostile.cpp, the rendezvous ports' in test_hostile_peers.cpp.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "distributed/gloo/gloo_mesh.h"
#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"
#include "dpar/tensor/tensor.h"
#include "unit/flipping_proxy.h"

using namespace dpar;
using namespace dpar::dist;
using Catch::Matchers::Contains;

namespace {

using Proxy = test::FlippingProxy;

// The proxies of one job, shared by the ranks' stores.
struct Proxies {
  std::mutex mu;
  Proxy::Plan plan;
  std::vector<std::unique_ptr<Proxy>> all;
  bool flipped() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& p : all)
      if (p->flipped()) return true;
    return false;
  }
};

// The port of the IPv4 address rank `owner` published for `peer` in a Gloo mesh's
// "addr/<owner>" blob (dist::detail::AddressEntry), as a pointer into the blob, or null.
uint8_t* port_field(Bytes& blob, int32_t peer, int owner) {
  const auto e = dist::detail::find_address_entry(blob, peer, owner);
  if (e.length < sizeof(sockaddr_in)) return nullptr;
  sockaddr_in a{};
  std::memcpy(&a, blob.data() + e.offset, sizeof a);
  if (a.sin_family != AF_INET) return nullptr;
  return blob.data() + e.offset + offsetof(sockaddr_in, sin_port);
}

uint16_t raw_port(const uint8_t* field) {
  uint16_t v = 0;
  std::memcpy(&v, field, 2);
  return v;  // network byte order, as Gloo compares it
}

// A rank's store that routes the rank's Gloo connection through a FlippingProxy: when the rank
// reads its peer's address to connect to it, the port becomes the proxy's. Only the rank that
// connects is redirected: Gloo's pair connects from the side whose (address, port in network
// byte order) is the larger and waits on the other, so the proxy's port is drawn to keep that
// order.
class ProxyingStore final : public Store {
 public:
  ProxyingStore(std::shared_ptr<Store> inner, int rank, Proxies& proxies)
      : inner_(std::move(inner)), rank_(rank), proxies_(proxies) {}
  void set(const std::string& key, const Bytes& value) override { inner_->set(key, value); }
  Bytes get(const std::string& key) override {
    Bytes value = inner_->get(key);
    const size_t at = key.rfind("/addr/");
    if (at == std::string::npos) return value;
    const int owner = std::stoi(key.substr(at + 6));
    Bytes mine = inner_->get(key.substr(0, at + 6) + std::to_string(rank_));
    uint8_t* theirs = port_field(value, rank_, owner);
    const uint8_t* ours = port_field(mine, owner, rank_);
    if (theirs == nullptr || ours == nullptr) return value;
    const uint16_t own_raw = raw_port(ours);
    if (own_raw <= raw_port(theirs)) return value;  // this rank waits; the peer connects
    std::lock_guard<std::mutex> lock(proxies_.mu);
    proxies_.all.push_back(std::make_unique<Proxy>(
        ntohs(raw_port(theirs)), proxies_.plan,
        [own_raw](int port) { return htons(static_cast<uint16_t>(port)) < own_raw; }));
    const uint16_t proxy_raw = htons(static_cast<uint16_t>(proxies_.all.back()->port()));
    std::memcpy(theirs, &proxy_raw, 2);
    return value;
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_->compare_set(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    inner_->wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }

 private:
  std::shared_ptr<Store> inner_;
  const int rank_;
  Proxies& proxies_;
};

constexpr int64_t kNumel = 1 << 16;  // 256 KiB of f32: each ring chunk is one 128 KiB segment

struct RankOutcome {
  std::vector<float> result;
  std::string error;
  double seconds = 0;
};

// Two ranks (or one per entry of `hosts`, standing for ranks on those hosts), each through its
// ProxyingStore, make a Gloo group and run `op` once on rank-dependent data; returns what each
// saw.
std::vector<RankOutcome> run_corrupted(
    Proxies& proxies, const std::function<std::vector<float>(ProcessGroup&, int)>& op,
    const std::vector<std::string>& hosts = {}) {
  const int size = hosts.empty() ? 2 : static_cast<int>(hosts.size());
  StoreServer server("127.0.0.1", 0, "gloocorrupt", size);
  std::vector<RankOutcome> out(static_cast<size_t>(size));
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      const auto start = std::chrono::steady_clock::now();
      try {
        StoreClientOptions so;
        so.log_waiting = false;
        auto client = std::make_shared<StoreClient>(server.endpoint(),
                                                    StoreIdentity{"gloocorrupt", size, r}, so);
        ProcessGroupOptions o;
        o.timeout = std::chrono::seconds(20);
        // The bytes must cross the proxied TCP connections: the ranks share this host, so their
        // allreduce would otherwise go through shared memory. With `hosts`, the hops between
        // two of them go through the proxies, the others through shared memory.
        o.shared_memory = !hosts.empty();
        if (!hosts.empty()) o.host_identity = hosts[static_cast<size_t>(r)];
        // Leaving the scope destroys the group, which closes its connections: the peer's
        // pending transfers then fail at once instead of at the timeout.
        auto group =
            make_gloo_group(std::make_shared<ProxyingStore>(client, r, proxies), r, size, o);
        out[static_cast<size_t>(r)].result = op(*group, r);
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)].error = e.what();
      }
      out[static_cast<size_t>(r)].seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (auto& t : ranks) t.join();
  return out;
}

std::vector<float> ramp(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i % 97) + rank);
  return v;
}

// The checks every case shares: the proxy flipped a byte; the rank that received it failed with
// one line naming the op, itself and the CRC; every rank either failed or holds exactly the
// result an uncorrupted run gives; nobody waited for the 20 s timeout.
void check_detected(const std::vector<RankOutcome>& out, bool flipped, const std::string& op,
                    const std::vector<std::vector<float>>& expected) {
  REQUIRE(flipped);
  int detected = 0;
  for (size_t r = 0; r < out.size(); ++r) {
    INFO("rank " << r << ": " << out[r].error);
    CHECK(out[r].seconds < 15);
    CHECK(out[r].error.find('\n') == std::string::npos);
    if (out[r].error.empty()) {
      CHECK(out[r].result == expected[r]);  // finished: then with the right numbers
    } else if (out[r].error.find("CRC-32C") != std::string::npos) {
      ++detected;
      CHECK_THAT(out[r].error, Contains(op) && Contains("on rank " + std::to_string(r)) &&
                                   Contains("corrupted in transit"));
    }
  }
  CHECK(detected == 1);
}

Proxy::Plan payload_plan() {
  Proxy::Plan plan;
  plan.protocol = Proxy::Protocol::kGloo;
  plan.direction = Proxy::Direction::kEither;
  plan.spot = Proxy::Spot::kPayload;
  plan.nth = 1;             // the first tensor payload on the connection
  plan.min_payload = 1024;  // not the 40-byte rendezvous handshake, not a CRC message
  return plan;
}

}  // namespace

TEST_CASE("gloo: a byte flipped in an allreduce's payload fails it, naming the rank and the op",
          "[gloo][hostile]") {
  // 256 KiB travel in segments followed by their CRCs; 16 KiB as one message per hop, the CRC
  // behind the bytes in a staging slot.
  for (int64_t numel : {kNumel, int64_t{4096}}) {
    Proxies proxies;
    proxies.plan = payload_plan();
    const auto out = run_corrupted(proxies, [numel](ProcessGroup& pg, int rank) {
      Tensor t = Tensor::from_vector(ramp(rank, numel), {numel});
      pg.allreduce({t})->wait();
      return t.to_float_vector();
    });
    std::vector<float> sum = ramp(0, numel);
    const std::vector<float> one = ramp(1, numel);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += one[i];
    check_detected(out, proxies.flipped(), "allreduce(f32[" + std::to_string(numel) + "])",
                   {sum, sum});
  }
}

TEST_CASE("gloo: a byte flipped on a TCP hop of the hierarchical allreduce or broadcast fails it",
          "[gloo][hostile]") {
  // Ranks 0 and 1 stand for one host, rank 2 for another: the hops 1 -> 2 and 2 -> 0 cross the
  // proxies, 0 -> 1 goes through shared memory (the broadcast from rank 0 is the chain
  // 0 -> 1 -> 2). Segments with their CRCs apart (256 KiB) and small chunks with the CRC behind
  // them (16 KiB) are both checked.
  for (const bool broadcast : {false, true}) {
    for (int64_t numel : {kNumel, int64_t{4096}}) {
      Proxies proxies;
      proxies.plan = payload_plan();
      const auto out =
          run_corrupted(proxies,
                        [numel, broadcast](ProcessGroup& pg, int rank) {
                          Tensor t = Tensor::from_vector(ramp(rank, numel), {numel});
                          broadcast ? pg.broadcast({t}, 0)->wait() : pg.allreduce({t})->wait();
                          return t.to_float_vector();
                        },
                        {"host a", "host a", "host b"});
      REQUIRE(proxies.flipped());
      std::vector<float> want = ramp(0, numel);
      for (int r = 1; r < 3 && !broadcast; ++r) {
        const std::vector<float> v = ramp(r, numel);
        for (size_t i = 0; i < want.size(); ++i) want[i] += v[i];
      }
      const std::string call = std::string(broadcast ? "broadcast" : "allreduce") + "(f32[" +
                               std::to_string(numel) + (broadcast ? "], root 0)" : "])");
      int detected = 0;
      for (size_t r = 0; r < out.size(); ++r) {
        INFO(call << ", rank " << r << ": " << out[r].error);
        CHECK(out[r].seconds < 15);
        if (out[r].error.empty()) {
          CHECK(out[r].result == want);  // finished: then with the right numbers
        } else if (out[r].error.find("CRC-32C") != std::string::npos) {
          ++detected;
          CHECK_THAT(out[r].error, Contains(call) && Contains("corrupted in transit"));
          // A hop of the chain names the rank before it (Gloo's tree names the root).
          if (broadcast) CHECK_THAT(out[r].error, Contains("received from rank 1"));
        }
      }
      CHECK(detected >= 1);
    }
  }
}

TEST_CASE("gloo: a byte flipped in an allgather, reduce_scatter or broadcast is detected",
          "[gloo][hostile]") {
  const std::vector<float> zero = ramp(0, kNumel), one = ramp(1, kNumel);
  SECTION("allgather") {
    Proxies proxies;
    proxies.plan = payload_plan();
    const auto out = run_corrupted(proxies, [](ProcessGroup& pg, int rank) {
      Tensor in = Tensor::from_vector(ramp(rank, kNumel), {kNumel});
      Tensor all = Tensor::zeros({2 * kNumel});
      pg.allgather({all.slice(0, 0, kNumel), all.slice(0, kNumel, 2 * kNumel)}, in)->wait();
      return all.to_float_vector();
    });
    std::vector<float> both = zero;
    both.insert(both.end(), one.begin(), one.end());
    check_detected(out, proxies.flipped(), "allgather", {both, both});
  }
  SECTION("reduce_scatter") {
    Proxies proxies;
    proxies.plan = payload_plan();
    const auto out = run_corrupted(proxies, [](ProcessGroup& pg, int rank) {
      Tensor in = Tensor::from_vector(ramp(rank, 2 * kNumel), {2 * kNumel});
      Tensor mine = Tensor::zeros({kNumel});
      pg.reduce_scatter(mine, {in.slice(0, 0, kNumel), in.slice(0, kNumel, 2 * kNumel)})->wait();
      return mine.to_float_vector();
    });
    const std::vector<float> a0 = ramp(0, 2 * kNumel), a1 = ramp(1, 2 * kNumel);
    std::vector<std::vector<float>> want(2, std::vector<float>(kNumel));
    for (size_t r = 0; r < 2; ++r)
      for (size_t i = 0; i < static_cast<size_t>(kNumel); ++i)
        want[r][i] = a0[r * kNumel + i] + a1[r * kNumel + i];
    check_detected(out, proxies.flipped(), "reduce_scatter", want);
  }
  SECTION("broadcast, from either root") {
    for (int root : {0, 1}) {
      Proxies proxies;
      proxies.plan = payload_plan();
      const auto out = run_corrupted(proxies, [root](ProcessGroup& pg, int rank) {
        Tensor t = Tensor::from_vector(ramp(rank, kNumel), {kNumel});
        try {
          pg.broadcast({t}, root)->wait();
        } catch (const std::exception&) {
          // A receiver that failed keeps its tensor as it was, not half-written.
          if (t.to_float_vector() != ramp(rank, kNumel))
            throw std::runtime_error("the failed broadcast changed rank's tensor");
          throw;
        }
        return t.to_float_vector();
      });
      const std::vector<float> sent = ramp(root, kNumel);
      check_detected(out, proxies.flipped(), "broadcast", {sent, sent});
      CHECK(out[static_cast<size_t>(root)].error.empty());  // the root's bytes left intact
    }
  }
}

// Run in a child process by the next case: Gloo aborts the process it runs in.
TEST_CASE("gloo: child: an allreduce whose frame header is flipped", "[.][gloo-header-child]") {
  Proxies proxies;
  proxies.plan = payload_plan();
  proxies.plan.spot = Proxy::Spot::kFrameHeader;
  proxies.plan.header_byte = 16;  // the slot's low byte: a slot nobody posted
  run_corrupted(proxies, [](ProcessGroup& pg, int rank) {
    Tensor t = Tensor::from_vector(ramp(rank, kNumel), {kNumel});
    pg.allreduce({t})->wait();
    return t.to_float_vector();
  });
}

TEST_CASE("gloo: a frame header Gloo cannot place stops the process with a line naming the op",
          "[gloo][hostile]") {
  // Gloo's event-loop thread throws on such a frame where nothing catches it, and dies holding
  // the pair's lock: the process cannot go on, so what dpar owes is the line saying why.
  const std::string command =
      "/proc/" + std::to_string(::getpid()) + "/exe '[gloo-header-child]' 2>&1";
  FILE* child = ::popen(command.c_str(), "r");
  REQUIRE(child != nullptr);
  std::string output;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, child)) > 0) output.append(buf, n);
  const int status = ::pclose(child);
  INFO(output);
  CHECK(status != 0);
  CHECK_THAT(output, Contains("dpar: rank ") && Contains("in allreduce(f32[65536]) #1") &&
                         Contains("a frame on a Gloo connection was corrupted in transit or "
                                  "forged"));
}
