// EtcdStore: the rendezvous Store over etcd's v3 gRPC API (lib/proto/etcd_v3.proto).
#include "dpar/distributed/etcd_store.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "distributed/store_common.h"
#include "etcd_v3.grpc.pb.h"

namespace dpar::dist {
namespace {

namespace pb = etcdserverpb;
using Clock = std::chrono::steady_clock;

// IPv4 addresses of this machine's interfaces.
std::vector<std::string> local_ipv4_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr) out.emplace_back(text);
  }
  freeifaddrs(list);
  return out;
}

bool is_ipv4(const std::string& host) {
  in_addr addr{};
  return inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

// The gRPC target for "ip:port[,ip:port...]": one endpoint as given (a host name resolves by
// DNS); several as gRPC's static "ipv4:" list, which the channel walks when the member it talks
// to goes away. This machine's own member comes first: a node cut off from the others then
// talks to its own member (and learns it lost the quorum) while every other node keeps talking
// to a member on its side.
std::string channel_target(const std::string& endpoints) {
  std::vector<std::string> list;
  size_t start = 0;
  for (;;) {
    const size_t comma = endpoints.find(',', start);
    list.push_back(endpoints.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::vector<std::string> hosts;
  for (const std::string& e : list) {
    std::string host;
    int port = 0;
    DPAR_CHECK(detail::split_host_port(e, &host, &port), "etcd: bad endpoint '", e, "' in '",
               endpoints, "' (expected ip:port, or a list ip:port,ip:port)");
    hosts.push_back(host);
  }
  if (list.size() == 1) return list[0];
  const std::vector<std::string> local = local_ipv4_addresses();
  std::vector<std::string> ordered, others;
  for (size_t i = 0; i < list.size(); ++i) {
    DPAR_CHECK(is_ipv4(hosts[i]), "etcd: endpoint '", list[i], "' in '", endpoints,
               "': a list of etcd members takes IPv4 addresses (one endpoint may be a name)");
    const bool here = std::find(local.begin(), local.end(), hosts[i]) != local.end();
    (here ? ordered : others).push_back(list[i]);
  }
  ordered.insert(ordered.end(), others.begin(), others.end());
  std::string target = "ipv4:";
  for (size_t i = 0; i < ordered.size(); ++i) target += (i ? "," : "") + ordered[i];
  return target;
}

// The end of `s` as a byte range: every key with prefix s (etcd's "range_end = prefix + 1").
std::string prefix_end(std::string s) {
  while (!s.empty()) {
    if (static_cast<unsigned char>(s.back()) < 0xff) {
      s.back() = static_cast<char>(s.back() + 1);
      return s;
    }
    s.pop_back();
  }
  return std::string(1, '\0');
}

// Errors worth another try on the same or another member: the member went away, a leader
// election is running ("etcdserver: leader changed", "no leader"), a request timed out inside
// the cluster.
bool transient(const grpc::Status& s) { return s.error_code() == grpc::StatusCode::UNAVAILABLE; }

// etcd 3.4 hands its request context's own error back unconverted, which its gRPC turns into
// UNKNOWN "context deadline exceeded": the member's copy of our deadline ran out a moment
// before ours did. Read that as the timeout it is, so that it is retried and reported as one.
grpc::Status with_timeouts_named(grpc::Status s) {
  if (s.error_code() != grpc::StatusCode::UNKNOWN) return s;
  if (s.error_message() == "context deadline exceeded")
    return {grpc::StatusCode::DEADLINE_EXCEEDED, s.error_message()};
  if (s.error_message() == "context canceled")
    return {grpc::StatusCode::CANCELLED, s.error_message()};
  return s;
}

// The longest one attempt of a request may take before it is tried again (Impl::retrying).
constexpr Millis kAttempt{2000};

std::string random_id() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::random_device device;
  char nonce[17];
  std::snprintf(nonce, sizeof nonce, "%08x%08x", device(), device());
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + nonce;
}

}  // namespace

struct EtcdStore::Impl {
  std::string endpoints;
  std::string prefix;  // "/dpar/<job id>/"
  EtcdStoreOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Lease::Stub> lease;
  // add()'s receipt: written in the same transaction as the new value, so an add whose answer
  // was lost (the member died) is known to have happened or not, and never counts twice.
  std::string receipt_key;
  std::atomic<int64_t> add_sequence{0};

  std::mutex lease_mutex;  // guards lease_id, stopping
  std::condition_variable lease_cv;
  int64_t lease_id = 0;
  bool stopping = false;
  std::thread keeper;

  // One request, in attempts of at most kAttempt: each waits for a member (wait_for_ready), and
  // the request is tried again while the answer is transient. A request proposed just as the
  // leader died waits inside etcd for its own timeout (7 s) before it says so; the attempt's
  // deadline abandons it sooner and the next attempt reaches the new leader. fn(ctx) performs
  // the stub call; it must be safe to repeat (see add() for the one that is not by itself).
  template <class Fn>
  grpc::Status retrying(Millis budget, Fn fn) {
    const auto deadline = std::chrono::system_clock::now() + budget;
    for (;;) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::min(deadline, std::chrono::system_clock::now() + kAttempt));
      ctx.set_wait_for_ready(true);
      grpc::Status s = with_timeouts_named(fn(&ctx));
      const bool again = transient(s) || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (s.ok() || !again || std::chrono::system_clock::now() + Millis(50) >= deadline) return s;
      std::this_thread::sleep_for(Millis(50));
    }
  }

  [[noreturn]] void fail(const grpc::Status& s, const std::string& what) const {
    switch (s.error_code()) {
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        DPAR_FAIL("lost the etcd cluster at ", endpoints, " during ", what,
                  " (no member answered in ", detail::format_seconds(options.rpc_timeout),
                  " s: ", s.error_message(), ")");
      default:
        DPAR_FAIL("etcd at ", endpoints, ": ", what, " failed: ", s.error_message());
    }
  }

  // The key's current entry (nullopt: absent) and the store's revision at the read.
  std::optional<pb::KeyValue> range(const std::string& key, int64_t* revision = nullptr) {
    pb::RangeRequest req;
    req.set_key(prefix + key);
    pb::RangeResponse rep;
    auto s = retrying(options.rpc_timeout,
                      [&](grpc::ClientContext* c) { return kv->Range(c, req, &rep); });
    if (!s.ok()) fail(s, "read '" + key + "'");
    if (revision != nullptr) *revision = rep.header().revision();
    if (rep.kvs_size() == 0) return std::nullopt;
    return rep.kvs(0);
  }

  void put(const std::string& key, const Bytes& value, int64_t with_lease) {
    pb::PutRequest req;
    req.set_key(prefix + key);
    req.set_value(value.data(), value.size());
    req.set_lease(with_lease);
    pb::PutResponse rep;
    auto s = retrying(options.rpc_timeout,
                      [&](grpc::ClientContext* c) { return kv->Put(c, req, &rep); });
    if (!s.ok()) fail(s, "set '" + key + "'");
  }

  // Blocks until `key` is put at a revision >= from, or until `until`; false on the latter (or
  // when the stream broke: the caller reads the key again and watches anew).
  bool watch_for_put(const std::string& key, int64_t from, Clock::time_point until) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + (until - Clock::now()));
    auto stream = watch->Watch(&ctx);
    pb::WatchRequest req;
    req.mutable_create_request()->set_key(prefix + key);
    req.mutable_create_request()->set_start_revision(from);
    bool put_seen = false;
    if (stream->Write(req)) {
      pb::WatchResponse rep;
      while (!put_seen && stream->Read(&rep)) {
        if (rep.canceled()) break;  // compacted past `from`: the caller reads the key again
        for (const pb::Event& e : rep.events())
          if (e.type() == pb::Event::PUT) put_seen = true;
      }
    }
    ctx.TryCancel();
    stream->Finish();
    return put_seen;
  }

  int64_t grant_lease() {
    pb::LeaseGrantRequest req;
    req.set_ttl(std::max<int64_t>(2, (options.lease_ttl.count() + 999) / 1000));
    pb::LeaseGrantResponse rep;
    auto s = retrying(options.connect_timeout,
                      [&](grpc::ClientContext* c) { return lease->LeaseGrant(c, req, &rep); });
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
          s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        DPAR_FAIL("could not reach etcd at ", endpoints, " after ",
                  detail::format_seconds(options.connect_timeout), " s (is etcd running there? ",
                  s.error_message(), ")");
      }
      fail(s, "grant a lease");
    }
    DPAR_CHECK(rep.error().empty(), "etcd at ", endpoints, ": lease grant refused: ", rep.error());
    return rep.id();
  }

  // Renews the lease a third of its time-to-live apart, each time on a short stream so that a
  // member that went away costs one interval, not a hang. A lease that expired anyway (this
  // process was stopped longer than its time-to-live) is replaced for later set_leased() calls;
  // the keys it held are gone, which is what the other members were told.
  void keep_lease_alive() {
    const Millis interval = std::max(Millis(300), options.lease_ttl / 3);
    std::unique_lock<std::mutex> lock(lease_mutex);
    while (!lease_cv.wait_for(lock, interval, [&] { return stopping; })) {
      const int64_t id = lease_id;
      lock.unlock();
      int64_t ttl_left = 1;
      {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + interval);
        auto stream = lease->LeaseKeepAlive(&ctx);
        pb::LeaseKeepAliveRequest req;
        req.set_id(id);
        pb::LeaseKeepAliveResponse rep;
        if (stream->Write(req) && stream->Read(&rep)) ttl_left = rep.ttl();
        ctx.TryCancel();
        stream->Finish();
      }
      int64_t replacement = 0;
      if (ttl_left <= 0) {
        try {
          replacement = grant_lease();
        } catch (const std::exception&) {
          // No member answered: the next interval tries again.
        }
      }
      lock.lock();
      if (replacement != 0) lease_id = replacement;
    }
  }

  int64_t current_lease() {
    std::lock_guard<std::mutex> lock(lease_mutex);
    return lease_id;
  }
};

EtcdStore::EtcdStore(const std::string& endpoints, std::string job_id, EtcdStoreOptions options)
    : impl_(std::make_unique<Impl>()) {
  DPAR_CHECK(!job_id.empty() && job_id.find('/') == std::string::npos, "etcd: job id '", job_id,
             "': expected a non-empty id without '/'");
  DPAR_CHECK(options.lease_ttl >= Millis(2000), "etcd: lease time-to-live ",
             detail::format_seconds(options.lease_ttl), " s is below etcd's floor (use >= 2 s)");
  Impl& m = *impl_;
  m.endpoints = endpoints;
  m.prefix = "/dpar/" + job_id + "/";
  m.options = std::move(options);
  timeout_ = m.options.timeout;
  m.receipt_key = "_add_receipts/" + random_id();

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A member whose host vanished (no RST) is found by a ping within ~8 s and the channel moves
  // on. etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time) and without a
  // call in flight, so the ping runs at that pace, only while calls run.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  m.channel = grpc::CreateCustomChannel(channel_target(endpoints),
                                        grpc::InsecureChannelCredentials(), args);
  m.kv = pb::KV::NewStub(m.channel);
  m.watch = pb::Watch::NewStub(m.channel);
  m.lease = pb::Lease::NewStub(m.channel);
  m.lease_id = m.grant_lease();  // also the first contact: names the endpoints if none answers
  m.keeper = std::thread([&m] { m.keep_lease_alive(); });
}

EtcdStore::~EtcdStore() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.lease_mutex);
    m.stopping = true;
  }
  m.lease_cv.notify_all();
  if (m.keeper.joinable()) m.keeper.join();
  // Best effort: a revoked lease takes this client's heartbeat keys with it now, not at expiry.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + Millis(1000));
  pb::LeaseRevokeRequest req;
  req.set_id(m.lease_id);
  pb::LeaseRevokeResponse rep;
  m.lease->LeaseRevoke(&ctx, req, &rep);
}

const std::string& EtcdStore::endpoints() const { return impl_->endpoints; }
Millis EtcdStore::lease_ttl() const { return impl_->options.lease_ttl; }

void EtcdStore::set(const std::string& key, const Bytes& value) { impl_->put(key, value, 0); }

void EtcdStore::set_leased(const std::string& key, const Bytes& value) {
  impl_->put(key, value, impl_->current_lease());
}

void EtcdStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  Impl& m = *impl_;
  constexpr Millis kLongest = std::chrono::hours(24 * 365);
  const auto deadline = Clock::now() + std::clamp(timeout, Millis(0), kLongest);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (;;) {
      int64_t revision = 0;
      if (m.range(keys[i], &revision)) break;
      const auto now = Clock::now();
      if (now >= deadline) {
        std::vector<std::string> missing;
        for (size_t j = i; j < keys.size(); ++j)
          if (!m.range(keys[j])) missing.push_back(keys[j]);
        DPAR_FAIL("timed out after ", detail::format_seconds(timeout), " s waiting for key",
                  missing.size() > 1 ? "s " : " ", detail::quote_keys(missing), " in etcd at ",
                  m.endpoints);
      }
      // Watch slices of at most a second: a stream on a member that stopped hearing the
      // cluster would otherwise wait forever; each slice reads the key again.
      m.watch_for_put(keys[i], revision + 1, std::min(deadline, now + Millis(1000)));
    }
  }
}

Bytes EtcdStore::get(const std::string& key) {
  for (;;) {
    wait({key}, timeout_);
    if (auto entry = impl_->range(key)) return Bytes(entry->value().begin(), entry->value().end());
  }
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys)
    if (!impl_->range(key)) return false;
  return true;
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  Impl& m = *impl_;
  const auto give_up = Clock::now() + m.options.rpc_timeout;
  for (;;) {
    const auto entry = m.range(key);
    int64_t current = 0;
    if (entry) {
      const std::string& text = entry->value();
      const char* end = text.data() + text.size();
      auto [ptr, ec] = std::from_chars(text.data(), end, current);
      DPAR_CHECK(ec == std::errc() && ptr == end, "etcd at ", m.endpoints, ": add: key '", key,
                 "' holds a value that is not an integer");
    }
    int64_t value = 0;
    DPAR_CHECK(!__builtin_add_overflow(current, delta, &value), "etcd at ", m.endpoints,
               ": add: key '", key, "' would overflow int64");
    const std::string receipt = std::to_string(++m.add_sequence);
    // Applies only if nobody changed the key since the read: the compare is on its revision.
    pb::TxnRequest txn;
    pb::Compare* cmp = txn.add_compare();
    cmp->set_key(m.prefix + key);
    cmp->set_result(pb::Compare::EQUAL);
    if (entry) {
      cmp->set_target(pb::Compare::MOD);
      cmp->set_mod_revision(entry->mod_revision());
    } else {
      cmp->set_target(pb::Compare::CREATE);
      cmp->set_create_revision(0);  // absent
    }
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(m.prefix + key);
    put->set_value(std::to_string(value));
    pb::PutRequest* mark = txn.add_success()->mutable_request_put();
    mark->set_key(m.prefix + m.receipt_key);
    mark->set_value(receipt);
    pb::TxnResponse rep;
    grpc::Status s;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kAttempt);
      ctx.set_wait_for_ready(true);
      s = with_timeouts_named(m.kv->Txn(&ctx, txn, &rep));
    }
    if (s.ok() && rep.succeeded()) return value;
    if (!s.ok()) {
      if (!transient(s) && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
        m.fail(s, "add '" + key + "'");
      // The answer was lost: the receipt says whether the transaction was applied.
      auto mark_now = m.range(m.receipt_key);
      if (mark_now && mark_now->value() == receipt) return value;
    }
    if (Clock::now() >= give_up) {
      m.fail(s.ok() ? grpc::Status(grpc::StatusCode::ABORTED,
                                   "other clients changed the key before every attempt")
                    : s,
             "add '" + key + "'");
    }
  }
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Impl& m = *impl_;
  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_key(m.prefix + key);
  cmp->set_result(pb::Compare::EQUAL);
  if (expected.empty()) {
    cmp->set_target(pb::Compare::CREATE);
    cmp->set_create_revision(0);  // "the key is absent", as in Store's contract
  } else {
    cmp->set_target(pb::Compare::VALUE);
    cmp->set_value(expected.data(), expected.size());
  }
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(m.prefix + key);
  put->set_value(desired.data(), desired.size());
  txn.add_failure()->mutable_request_range()->set_key(m.prefix + key);
  pb::TxnResponse rep;
  // Safe to retry: if a lost answer hid a success, the retry finds `desired` stored and returns
  // it, the same value as the success would have.
  auto s = m.retrying(m.options.rpc_timeout,
                      [&](grpc::ClientContext* c) { return m.kv->Txn(c, txn, &rep); });
  if (!s.ok()) m.fail(s, "compare_set '" + key + "'");
  if (rep.succeeded()) return desired;
  if (rep.responses_size() == 1 && rep.responses(0).response_range().kvs_size() == 1) {
    const std::string& now = rep.responses(0).response_range().kvs(0).value();
    return Bytes(now.begin(), now.end());
  }
  return {};
}

void EtcdStore::erase_job() {
  Impl& m = *impl_;
  pb::DeleteRangeRequest req;
  req.set_key(m.prefix);
  req.set_range_end(prefix_end(m.prefix));
  pb::DeleteRangeResponse rep;
  auto s = m.retrying(m.options.rpc_timeout,
                      [&](grpc::ClientContext* c) { return m.kv->DeleteRange(c, req, &rep); });
  if (!s.ok()) m.fail(s, "erase the job's keys");
}

}  // namespace dpar::dist
