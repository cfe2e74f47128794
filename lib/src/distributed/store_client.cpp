// StoreClient: a rank's connection to the rendezvous store of rank 0.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <charconv>
#include <iostream>
#include <thread>

#include "distributed/store_common.h"
#include "dpar/core/error.h"
#include "dpar/distributed/store.h"
#include "store.grpc.pb.h"

namespace dpar::dist {
namespace {

namespace rpc = dpar::rpc::store;
using std::chrono::steady_clock;
using std::chrono::system_clock;

// Blocking calls get this much longer than the wait they ask the server for, so the server's
// own "timed out, these keys are missing" answer arrives before the gRPC deadline fires.
constexpr Millis kReplyGrace{5000};

void check_endpoint(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  int port = 0;
  const char* first = endpoint.data() + (colon == std::string::npos ? 0 : colon + 1);
  const char* last = endpoint.data() + endpoint.size();
  auto [ptr, ec] = std::from_chars(first, last, port);
  DPAR_CHECK(colon != std::string::npos && colon > 0 && first != last && ec == std::errc() &&
                 ptr == last && port >= 1 && port <= 65535,
             "rendezvous store: bad endpoint '", endpoint, "' (expected <ip>:<port>)");
}

}  // namespace

struct StoreClient::Impl {
  std::string endpoint;
  StoreIdentity identity;
  StoreClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<rpc::KeyValueStore::Stub> stub;

  // Identity metadata on every call lets the server refuse a client of another job.
  void prepare(grpc::ClientContext& ctx, system_clock::time_point deadline) const {
    ctx.AddMetadata(detail::kJobIdKey, identity.job_id);
    ctx.AddMetadata(detail::kWorldSizeKey, std::to_string(identity.world_size));
    ctx.AddMetadata(detail::kRankKey, std::to_string(identity.rank));
    ctx.set_deadline(deadline);
  }

  // Runs one call with the given deadline; fn(ctx) performs the stub call.
  template <class Fn>
  grpc::Status call(Millis deadline_after, Fn fn) const {
    // Clamped so "wait forever" style timeouts (Millis::max()) cannot overflow the clock.
    constexpr Millis kLongest = std::chrono::hours(24 * 365);
    grpc::ClientContext ctx;
    prepare(ctx, system_clock::now() + std::clamp(deadline_after, Millis(0), kLongest));
    return fn(&ctx);
  }

  // One line that names the store, what was being done and, where it helps, what to check.
  [[noreturn]] void fail(const grpc::Status& s, const std::string& what) const {
    switch (s.error_code()) {
      case grpc::StatusCode::FAILED_PRECONDITION:
        DPAR_FAIL("refused by the store at ", endpoint, ": ", s.error_message());
      case grpc::StatusCode::ABORTED:
        DPAR_FAIL("the rendezvous store at ", endpoint, " shut down during ", what,
                  " (did rank 0 exit?)");
      case grpc::StatusCode::UNAVAILABLE:
        DPAR_FAIL("lost the rendezvous store at ", endpoint, " during ", what, ": ",
                  s.error_message(), " (did rank 0 exit?)");
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        DPAR_FAIL("the rendezvous store at ", endpoint, " did not answer ", what, " in time");
      default:
        DPAR_FAIL("rendezvous store at ", endpoint, ": ", what, " failed: ", s.error_message());
    }
  }

  void log_line(const std::string& line) const {
    if (options.log)
      options.log(line);
    else
      std::cerr << line << std::endl;
  }

  // Says Hello until the server answers, retrying through "connection refused" while rank 0 is
  // still starting. gRPC's channel does the reconnecting (backoff 50 ms growing to 1 s, set on
  // the channel); wait_for_ready keeps the call queued across those attempts, and the call's
  // deadline is cut at each log tick so the waiting line appears on time.
  void connect() {
    const auto start = steady_clock::now();
    const auto deadline = start + options.connect_timeout;
    const Millis interval = std::max(options.log_interval, Millis(100));
    auto next_log = start + interval;
    rpc::HelloRequest req;
    req.set_job_id(identity.job_id);
    req.set_world_size(identity.world_size);
    req.set_rank(identity.rank);
    while (true) {
      grpc::ClientContext ctx;
      const auto slice_end = std::min(deadline, next_log);
      prepare(ctx, system_clock::now() + (slice_end - steady_clock::now()));
      ctx.set_wait_for_ready(true);
      rpc::HelloReply rep;
      const grpc::Status s = stub->Hello(&ctx, req, &rep);
      if (s.ok()) return;
      const auto code = s.error_code();
      if (code != grpc::StatusCode::DEADLINE_EXCEEDED && code != grpc::StatusCode::UNAVAILABLE)
        fail(s, "hello");
      const auto now = steady_clock::now();
      if (now >= deadline) {
        DPAR_FAIL("could not reach the rendezvous store of rank 0 at ", endpoint, " after ",
                  detail::format_seconds(options.connect_timeout),
                  " s (is rank 0 running? is the address/port right?)");
      }
      if (now >= next_log) {
        if (options.log_waiting) {
          auto waited = std::chrono::duration_cast<Millis>(now - start);
          if (waited >= Millis(1000)) waited = std::chrono::round<std::chrono::seconds>(waited);
          log_line("waiting for rank 0 at " + endpoint + " (" + detail::format_seconds(waited) +
                   " s)");
        }
        while (next_log <= now) next_log += interval;
      }
      // UNAVAILABLE despite wait_for_ready (e.g. a server going away mid-handshake) returns at
      // once; pause briefly so the loop does not spin.
      if (code == grpc::StatusCode::UNAVAILABLE)
        std::this_thread::sleep_for(std::min<steady_clock::duration>(Millis(50), deadline - now));
    }
  }
};

StoreClient::StoreClient(const std::string& endpoint, StoreIdentity identity,
                         StoreClientOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_endpoint(endpoint);
  // World size 0 (with rank 0): a member of an elastic job, whose ranks change between rounds.
  const bool elastic = identity.world_size == 0 && identity.rank == 0;
  DPAR_CHECK(
      elastic ||
          (identity.world_size >= 1 && identity.rank >= 0 && identity.rank < identity.world_size),
      "rendezvous store: rank ", identity.rank, " is outside world size ", identity.world_size);
  timeout_ = options.timeout;
  impl_->endpoint = endpoint;
  impl_->identity = std::move(identity);
  impl_->options = std::move(options);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(detail::kMaxMessageBytes);
  args.SetMaxSendMessageSize(detail::kMaxMessageBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Each client owns its connection: ranks run as threads of one test process must not share
  // gRPC's global subchannel pool (and its backoff state) with each other.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Ping an idle connection so a server host that vanished (no RST) fails a long Get/Wait
  // within ~40 s instead of at the end of its timeout.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  impl_->channel =
      grpc::CreateCustomChannel(impl_->endpoint, grpc::InsecureChannelCredentials(), args);
  impl_->stub = rpc::KeyValueStore::NewStub(impl_->channel);
  impl_->connect();
}

StoreClient::~StoreClient() = default;

const std::string& StoreClient::endpoint() const { return impl_->endpoint; }

void StoreClient::set(const std::string& key, const Bytes& value) {
  rpc::SetRequest req;
  req.set_key(key);
  req.set_value(value.data(), value.size());
  rpc::SetReply rep;
  auto s = impl_->call(impl_->options.rpc_timeout,
                       [&](grpc::ClientContext* c) { return impl_->stub->Set(c, req, &rep); });
  if (!s.ok()) impl_->fail(s, "set '" + key + "'");
}

Bytes StoreClient::get(const std::string& key) {
  rpc::GetRequest req;
  req.set_key(key);
  req.set_timeout_ms(std::max<int64_t>(timeout_.count(), 0));
  rpc::GetReply rep;
  auto s = impl_->call(std::min(timeout_, Millis::max() - kReplyGrace) + kReplyGrace,
                       [&](grpc::ClientContext* c) { return impl_->stub->Get(c, req, &rep); });
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || (s.ok() && !rep.found())) {
    DPAR_FAIL("timed out after ", detail::format_seconds(timeout_), " s waiting for key '", key,
              "' in the rendezvous store at ", impl_->endpoint);
  }
  if (!s.ok()) impl_->fail(s, "get '" + key + "'");
  return Bytes(rep.value().begin(), rep.value().end());
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  rpc::AddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  rpc::AddReply rep;
  auto s = impl_->call(impl_->options.rpc_timeout,
                       [&](grpc::ClientContext* c) { return impl_->stub->Add(c, req, &rep); });
  if (!s.ok()) impl_->fail(s, "add '" + key + "'");
  return rep.value();
}

Bytes StoreClient::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  rpc::CompareSetRequest req;
  req.set_key(key);
  req.set_expected(expected.data(), expected.size());
  req.set_desired(desired.data(), desired.size());
  rpc::CompareSetReply rep;
  auto s = impl_->call(impl_->options.rpc_timeout, [&](grpc::ClientContext* c) {
    return impl_->stub->CompareSet(c, req, &rep);
  });
  if (!s.ok()) impl_->fail(s, "compare_set '" + key + "'");
  return Bytes(rep.value().begin(), rep.value().end());
}

void StoreClient::wait(const std::vector<std::string>& keys, Millis timeout) {
  if (keys.empty()) return;
  rpc::WaitRequest req;
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(std::max<int64_t>(timeout.count(), 0));
  rpc::WaitReply rep;
  auto s = impl_->call(std::min(timeout, Millis::max() - kReplyGrace) + kReplyGrace,
                       [&](grpc::ClientContext* c) { return impl_->stub->Wait(c, req, &rep); });
  std::vector<std::string> missing(rep.missing().begin(), rep.missing().end());
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) missing = keys;
  if (!missing.empty() && (s.ok() || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
    DPAR_FAIL("timed out after ", detail::format_seconds(timeout), " s waiting for key",
              missing.size() > 1 ? "s " : " ", detail::quote_keys(missing),
              " in the rendezvous store at ", impl_->endpoint);
  }
  if (!s.ok()) impl_->fail(s, "wait for " + detail::quote_keys(keys));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  rpc::CheckRequest req;
  for (const auto& k : keys) req.add_keys(k);
  rpc::CheckReply rep;
  auto s = impl_->call(impl_->options.rpc_timeout,
                       [&](grpc::ClientContext* c) { return impl_->stub->Check(c, req, &rep); });
  if (!s.ok()) impl_->fail(s, "check " + detail::quote_keys(keys));
  return rep.ready();
}

}  // namespace dpar::dist
