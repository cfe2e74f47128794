// StoreServer: the rendezvous key-value store hosted by rank 0 (gRPC sync server).
//
// gRPC's synchronous server runs every handler on its own thread from a pool it grows on
// demand, so a blocking Get/Wait simply sleeps on a condition variable until a writer notifies
// it, the request's timeout passes, or shutdown() wakes everybody. No handler polls the map.
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "distributed/peer_refusals.h"
#include "distributed/store_common.h"
#include "dpar/core/error.h"
#include "dpar/distributed/store.h"
#include "store.grpc.pb.h"

namespace dpar::dist {
namespace {

namespace rpc = dpar::rpc::store;
using std::chrono::steady_clock;

std::string metadata_value(const grpc::ServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

class StoreService final : public rpc::KeyValueStore::Service {
 public:
  StoreService(std::string job_id, int world_size, const std::string& where,
               std::function<void(const std::string&)> log)
      : job_id_(std::move(job_id)),
        world_size_(world_size),
        refusals_("rendezvous store " + where, std::move(log)) {}

  // Wakes every blocked Get/Wait (they answer "store shut down") and refuses later calls.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
  }

  grpc::Status Hello(grpc::ServerContext* ctx, const rpc::HelloRequest* req,
                     rpc::HelloReply* rep) override {
    rep->set_job_id(job_id_);
    rep->set_world_size(world_size_);
    if (auto s = check_identity(req->job_id(), req->world_size()); !s.ok()) {
      return noted(ctx, std::move(s));
    }
    // World size 0: an elastic job, whose members have no fixed rank at the store.
    if (world_size_ > 0 && (req->rank() < 0 || req->rank() >= world_size_)) {
      return noted(ctx, refuse("it serves job '" + job_id_ + "' with world size " +
                               std::to_string(world_size_) + ", this process claims rank " +
                               std::to_string(req->rank()) + " (valid ranks are 0.." +
                               std::to_string(world_size_ - 1) + ")"));
    }
    return admit(ctx);
  }

  grpc::Status Set(grpc::ServerContext* ctx, const rpc::SetRequest* req, rpc::SetReply*) override {
    if (auto s = admit(ctx); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kv_[slot(req->key())] = req->value();
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* ctx, const rpc::GetRequest* req,
                   rpc::GetReply* rep) override {
    if (auto s = admit(ctx); !s.ok()) return s;
    const std::string key = slot(req->key());
    std::unique_lock<std::mutex> lock(mu_);
    const WaitEnd end = wait_until(lock, ctx, req->timeout_ms(), [&] { return kv_.count(key); });
    if (end == WaitEnd::kReady) {
      rep->set_found(true);
      rep->set_value(kv_[key]);
    }
    return status_of(end);
  }

  grpc::Status Add(grpc::ServerContext* ctx, const rpc::AddRequest* req,
                   rpc::AddReply* rep) override {
    if (auto s = admit(ctx); !s.ok()) return s;
    int64_t value = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::string& stored = kv_[slot(req->key())];
      int64_t current = 0;
      if (!stored.empty()) {
        const char* end = stored.data() + stored.size();
        auto [ptr, ec] = std::from_chars(stored.data(), end, current);
        if (ec != std::errc() || ptr != end) {
          return {grpc::StatusCode::INVALID_ARGUMENT,
                  "add: key '" + req->key() + "' holds a value that is not an integer"};
        }
      }
      if (__builtin_add_overflow(current, req->delta(), &value)) {
        return {grpc::StatusCode::INVALID_ARGUMENT, "add: key '" + req->key() +
                                                        "' would overflow int64 (" + stored +
                                                        " + " + std::to_string(req->delta()) + ")"};
      }
      stored = std::to_string(value);
    }
    cv_.notify_all();
    rep->set_value(value);
    return grpc::Status::OK;
  }

  grpc::Status CompareSet(grpc::ServerContext* ctx, const rpc::CompareSetRequest* req,
                          rpc::CompareSetReply* rep) override {
    if (auto s = admit(ctx); !s.ok()) return s;
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::string key = slot(req->key());
      auto it = kv_.find(key);
      const bool exists = it != kv_.end();
      // An empty expected value means "the key is absent".
      const bool match =
          req->expected().empty() ? !exists : exists && it->second == req->expected();
      if (match) {
        kv_[key] = req->desired();
        changed = true;
        rep->set_exists(true);
        rep->set_value(req->desired());
      } else if (exists) {
        rep->set_exists(true);
        rep->set_value(it->second);
      }
    }
    if (changed) cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Wait(grpc::ServerContext* ctx, const rpc::WaitRequest* req,
                    rpc::WaitReply* rep) override {
    if (auto s = admit(ctx); !s.ok()) return s;
    std::unique_lock<std::mutex> lock(mu_);
    auto all_present = [&] {
      return std::all_of(req->keys().begin(), req->keys().end(),
                         [&](const std::string& k) { return kv_.count(slot(k)) > 0; });
    };
    const WaitEnd end = wait_until(lock, ctx, req->timeout_ms(), all_present);
    if (end == WaitEnd::kTimeout) {
      for (const auto& k : req->keys())
        if (!kv_.count(slot(k))) rep->add_missing(k);
    }
    return status_of(end);
  }

  grpc::Status Check(grpc::ServerContext* ctx, const rpc::CheckRequest* req,
                     rpc::CheckReply* rep) override {
    if (auto s = admit(ctx); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    rep->set_ready(std::all_of(req->keys().begin(), req->keys().end(),
                               [&](const std::string& k) { return kv_.count(slot(k)) > 0; }));
    return grpc::Status::OK;
  }

 private:
  enum class WaitEnd { kReady, kTimeout, kStopped, kCancelled };

  // Keys live under the job id. A server serves one job, so this is a namespace rather than a
  // filter, but it keeps a dump of the map self-describing.
  std::string slot(const std::string& key) const { return job_id_ + '/' + key; }

  static grpc::Status refuse(const std::string& why) {
    return {grpc::StatusCode::FAILED_PRECONDITION, why};
  }

  grpc::Status check_identity(const std::string& job_id, int world_size) const {
    if (job_id == job_id_ && world_size == world_size_) return grpc::Status::OK;
    return refuse("it serves job '" + job_id_ + "' with world size " + std::to_string(world_size_) +
                  ", this process is job '" + job_id + "' with world size " +
                  std::to_string(world_size));
  }

  // Every call must carry this job's identity in its metadata: a client left over from an
  // older job (same port, new server) is refused instead of reading the new job's keys.
  grpc::Status admit(const grpc::ServerContext* ctx) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return {grpc::StatusCode::ABORTED, "store shut down"};
    }
    const std::string ws = metadata_value(ctx, detail::kWorldSizeKey);
    int world_size = 0;
    auto [ptr, ec] = std::from_chars(ws.data(), ws.data() + ws.size(), world_size);
    if (ws.empty() || ec != std::errc() || ptr != ws.data() + ws.size())
      return noted(ctx, refuse("the caller did not identify itself (not a dpar store client?)"));
    return noted(ctx, check_identity(metadata_value(ctx, detail::kJobIdKey), world_size));
  }

  // A refused call gets one log line naming its peer (PeerRefusals keeps that bounded).
  grpc::Status noted(const grpc::ServerContext* ctx, grpc::Status status) const {
    if (!status.ok()) refusals_.note(ctx->peer(), status.error_message());
    return status;
  }

  // Sleeps until ready() holds, the request's timeout passes, the server stops, or the caller
  // goes away. The wait wakes at least once a second only to notice a caller that vanished
  // (deadline passed, process died), so an abandoned request does not pin a server thread for
  // its whole timeout; writers wake it immediately through cv_.
  template <class Ready>
  WaitEnd wait_until(std::unique_lock<std::mutex>& lock, grpc::ServerContext* ctx,
                     int64_t timeout_ms, Ready ready) {
    constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;
    const auto deadline =
        steady_clock::now() + Millis(std::clamp<int64_t>(timeout_ms, 0, kMaxTimeoutMs));
    while (true) {
      if (stopping_) return WaitEnd::kStopped;
      if (ready()) return WaitEnd::kReady;
      const auto now = steady_clock::now();
      if (now >= deadline) return WaitEnd::kTimeout;
      if (ctx->IsCancelled()) return WaitEnd::kCancelled;
      cv_.wait_until(lock, std::min(deadline, now + std::chrono::seconds(1)));
    }
  }

  static grpc::Status status_of(WaitEnd end) {
    switch (end) {
      case WaitEnd::kStopped:
        return {grpc::StatusCode::ABORTED, "store shut down"};
      case WaitEnd::kCancelled:
        return grpc::Status::CANCELLED;
      default:  // ready, or timed out (the reply says which keys are missing)
        return grpc::Status::OK;
    }
  }

  const std::string job_id_;
  const int world_size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> kv_;
  bool stopping_ = false;
  mutable detail::PeerRefusals refusals_;
};

}  // namespace

namespace detail {

// gRPC reports a failed bind only as "no port selected" (plus a log line); binding a probe
// socket first lets the error say why (in use, not an address of this machine, ...). gRPC sets
// SO_REUSEADDR on its listeners, so the probe does too: a port in TIME_WAIT is not "in use".
void probe_bind(const std::string& host, int port, const std::string& where,
                const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string bare = host.size() > 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  if (int rc = getaddrinfo(bare.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    DPAR_FAIL(what, ": cannot listen on ", where, ": ", gai_strerror(rc));
  }
  std::string why;
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const int rc = bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    close(fd);
    if (rc == 0) {
      freeaddrinfo(found);
      return;
    }
    if (why.empty()) {
      why = err == EADDRINUSE      ? "address already in use (another job or a leftover process?)"
            : err == EADDRNOTAVAIL ? "not an address of this machine"
                                   : std::strerror(err);
    }
  }
  freeaddrinfo(found);
  DPAR_FAIL(what, ": cannot listen on ", where, ": ", why.empty() ? "no socket" : why);
}

std::unique_ptr<grpc::Server> start_grpc_server(const std::string& where, grpc::Service* service,
                                                int max_message_bytes, const std::string& what,
                                                int* port) {
  grpc::ServerBuilder builder;
  int selected = 0;
  // Only the address given: a server on a multi-homed host is not reachable elsewhere.
  builder.AddListeningPort(where, grpc::InsecureServerCredentials(), &selected);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  // gRPC enables SO_REUSEPORT by default, which would let a second job silently share the port
  // (and steal half the connections) instead of failing to bind.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping idle connections to notice a vanished server during long waits; allow it.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || selected == 0) {
    if (server) server->Shutdown();
    DPAR_FAIL(what, ": cannot listen on ", where, " (gRPC could not bind it; is the port in use?)");
  }
  if (port) *port = selected;
  return server;
}

}  // namespace detail

struct StoreServer::Impl {
  std::string host;
  int port = 0;
  std::mutex mu;  // serialises shutdown() against the destructor / a second shutdown()
  std::unique_ptr<StoreService> service;  // must outlive server
  std::unique_ptr<grpc::Server> server;
};

StoreServer::StoreServer(const std::string& host, int port, std::string job_id, int world_size,
                         std::function<void(const std::string&)> log)
    : impl_(std::make_unique<Impl>()) {
  const std::string where = detail::join_host_port(host, port);
  DPAR_CHECK(!host.empty(), "rendezvous store: empty host in ", where);
  DPAR_CHECK(port >= 0 && port <= 65535, "rendezvous store: cannot listen on ", where,
             ": port out of range 0..65535");
  DPAR_CHECK(world_size >= 0,
             "rendezvous store: world size must be >= 1 (or 0 for an elastic job), got ",
             world_size);
  detail::probe_bind(host, port, where, "rendezvous store");

  impl_->host = host;
  impl_->service =
      std::make_unique<StoreService>(std::move(job_id), world_size, where, std::move(log));
  int selected = 0;
  impl_->server = detail::start_grpc_server(where, impl_->service.get(), detail::kMaxMessageBytes,
                                            "rendezvous store", &selected);
  impl_->port = selected;
}

StoreServer::~StoreServer() { shutdown(); }

int StoreServer::port() const { return impl_->port; }

std::string StoreServer::endpoint() const {
  return detail::join_host_port(impl_->host, impl_->port);
}

void StoreServer::shutdown() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->server) return;
  // Wake blocked Get/Wait handlers first: gRPC's Shutdown waits for running handlers, and ours
  // now return "store shut down" at once. The deadline only cancels calls still in transit.
  impl_->service->stop();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->server->Wait();
  impl_->server.reset();
}

}  // namespace dpar::dist
