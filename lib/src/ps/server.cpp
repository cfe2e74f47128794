// ps::Server: the gRPC face of a parameter server. Handlers check the caller (job token,
// trainer id), move bytes between the wire and the shard, and leave every decision to
// ShardState. gRPC's synchronous server gives each call its own thread, so a pull that waits
// for a sync step simply sleeps in ShardState.
#include "dpar/ps/server.h"

#include <charconv>
#include <cstring>
#include <thread>

#include "distributed/peer_refusals.h"
#include "distributed/store_common.h"
#include "dpar/core/error.h"
#include "ps/ps_common.h"
#include "ps/shard_state.h"

namespace dpar::ps {
namespace {

using detail::CallError;
namespace rpc = detail::rpc;

std::string metadata_value(const grpc::ServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

grpc::Status to_status(const CallError& e) { return {e.code, e.message}; }

// Refuses a chunk whose checksum does not match what it carries (DATA_LOSS), before any of it
// is used: `what` names the call and the trainer.
template <class Message>
void check_chunk(const std::string& what, const Message& msg) {
  const uint32_t expected = detail::chunk_checksum(msg);
  if (msg.crc32c() != expected) {
    throw CallError{
        grpc::StatusCode::DATA_LOSS,
        detail::corrupted_chunk(what, msg.offset(), msg.data().size(), msg.crc32c(), expected)};
  }
}

// Copies one streamed chunk into `dest` (count elements) after checking it lies inside.
int64_t take_chunk(const std::string& where, int64_t offset, const std::string& data, float* dest,
                   int64_t count) {
  const int64_t len = static_cast<int64_t>(data.size() / 4);
  if (data.size() % 4 != 0 || offset < 0 || offset + len > count) {
    throw CallError{grpc::StatusCode::INVALID_ARGUMENT,
                    where + ": chunk [" + std::to_string(offset) + ", +" +
                        std::to_string(data.size()) + " bytes) outside the shard of " +
                        std::to_string(count) + " floats"};
  }
  if (len > 0) std::memcpy(dest + offset, data.data(), data.size());
  return len;
}

class PsService final : public rpc::ParameterServer::Service {
 public:
  PsService(detail::ShardState& state, std::string name, std::string token,
            std::function<void(const std::string&)> log)
      : state_(state),
        name_(std::move(name)),
        token_(std::move(token)),
        refusals_(name_, std::move(log)) {}

  grpc::Status Hello(grpc::ServerContext* ctx, const rpc::HelloRequest* req,
                     rpc::HelloReply* rep) override {
    return guarded([&] { *rep = state_.hello(admit(ctx), *req); });
  }

  grpc::Status Init(grpc::ServerContext* ctx, grpc::ServerReader<rpc::InitMessage>* reader,
                    rpc::InitReply* rep) override {
    return guarded([&] {
      const int trainer = admit(ctx);
      rpc::InitMessage msg;
      if (!reader->Read(&msg)) {
        throw CallError{grpc::StatusCode::INVALID_ARGUMENT,
                        name_ + ": init from trainer " + std::to_string(trainer) +
                            " carried no chunk (lost or corrupted in transit?)"};
      }
      const std::string what = name_ + ": init from trainer " + std::to_string(trainer) + ":";
      check_chunk(what, msg);
      const rpc::InitHeader header = msg.header();
      const int64_t count = state_.begin_init(trainer, header);
      Tensor values = Tensor::zeros({count});
      float* dest = count ? values.data<float>() : nullptr;
      int64_t received = take_chunk(name_ + " init", msg.offset(), msg.data(), dest, count);
      while (reader->Read(&msg)) {
        check_chunk(what, msg);
        received += take_chunk(name_ + " init", msg.offset(), msg.data(), dest, count);
      }
      if (header.resume_dir().empty() && received != count) {
        throw CallError{grpc::StatusCode::INVALID_ARGUMENT, name_ + ": init carried " +
                                                                std::to_string(received) + " of " +
                                                                std::to_string(count) + " floats"};
      }
      rep->set_version(state_.commit_init(trainer, header, values));
    });
  }

  grpc::Status Push(grpc::ServerContext* ctx, grpc::ServerReader<rpc::PushMessage>* reader,
                    rpc::PushReply* rep) override {
    int trainer = -1;
    bool open = false;
    grpc::Status status = guarded([&] {
      trainer = admit(ctx);
      rpc::PushMessage msg;
      if (!reader->Read(&msg)) {
        throw CallError{grpc::StatusCode::INVALID_ARGUMENT,
                        name_ + ": push from trainer " + std::to_string(trainer) +
                            " carried no chunk (lost or corrupted in transit?)"};
      }
      // Chunks land straight in the trainer's staging buffer: the one copy from the wire.
      // The first chunk, with the header, is checked before the header is believed.
      const std::string what = name_ + ": push from trainer " + std::to_string(trainer) +
                               " (step " + std::to_string(msg.header().step()) + "):";
      check_chunk(what, msg);
      float* dest = state_.begin_push(trainer, msg.header());
      open = true;
      const int64_t count = state_.shard_size();
      int64_t received = take_chunk(name_ + " push", msg.offset(), msg.data(), dest, count);
      while (reader->Read(&msg)) {
        // A corrupted chunk fails the whole push: abort_push below discards what came before.
        check_chunk(what, msg);
        received += take_chunk(name_ + " push", msg.offset(), msg.data(), dest, count);
      }
      open = false;
      rep->set_version(state_.end_push(trainer, received));
    });
    if (open) state_.abort_push(trainer);
    return status;
  }

  grpc::Status Pull(grpc::ServerContext* ctx, const rpc::PullRequest* req,
                    grpc::ServerWriter<rpc::PullMessage>* writer) override {
    return guarded([&] {
      const int trainer = admit(ctx);
      std::vector<rpc::PullMessage> messages = state_.pull(trainer, *req, ctx);
      for (const rpc::PullMessage& m : messages) {
        if (!writer->Write(m)) {
          throw CallError{grpc::StatusCode::CANCELLED, name_ + ": trainer went away mid-pull"};
        }
      }
    });
  }

  grpc::Status Save(grpc::ServerContext* ctx, const rpc::SaveRequest* req,
                    rpc::SaveReply* rep) override {
    return guarded(
        [&] { rep->set_path(state_.save(admit(ctx), req->dir(), req->step(), req->keep())); });
  }

  grpc::Status Ping(grpc::ServerContext* ctx, const rpc::PingRequest*, rpc::PingReply*) override {
    return guarded([&] { state_.ping(admit(ctx)); });
  }

  grpc::Status Finish(grpc::ServerContext* ctx, const rpc::FinishRequest* req,
                      rpc::FinishReply* rep) override {
    return guarded([&] { rep->set_trainers_left(state_.finish(admit(ctx), req->aborted())); });
  }

 private:
  template <class Body>
  grpc::Status guarded(Body body) {
    try {
      body();
      return grpc::Status::OK;
    } catch (const CallError& e) {
      return to_status(e);
    } catch (const std::exception& e) {
      return {grpc::StatusCode::FAILED_PRECONDITION, name_ + ": " + e.what()};
    }
  }

  // The trainer id from the metadata, once the job token matched.
  int admit(const grpc::ServerContext* ctx) const {
    const std::string token = metadata_value(ctx, detail::kTokenKey);
    if (token != token_) {
      const std::string why =
          token.empty() ? "it carries no job token" : "its job token belongs to another job";
      refusals_.note(ctx->peer(), why);
      throw CallError{grpc::StatusCode::UNAUTHENTICATED,
                      name_ + " refuses the call: " + why +
                          " (DPAR_JOB_TOKEN must be the one dpar-launch gave this job)"};
    }
    const std::string id = metadata_value(ctx, detail::kTrainerKey);
    int trainer = -1;
    auto [ptr, ec] = std::from_chars(id.data(), id.data() + id.size(), trainer);
    if (id.empty() || ec != std::errc() || ptr != id.data() + id.size()) {
      throw CallError{grpc::StatusCode::INVALID_ARGUMENT, name_ + ": call without a trainer id"};
    }
    return trainer;
  }

  detail::ShardState& state_;
  const std::string name_;
  const std::string token_;
  mutable dist::detail::PeerRefusals refusals_;
};

}  // namespace

struct Server::Impl {
  std::string endpoint;
  std::unique_ptr<detail::ShardState> state;
  std::unique_ptr<PsService> service;  // must outlive server
  std::unique_ptr<grpc::Server> server;
  std::mutex mu;
};

Server::Server(const ServerOptions& options) : impl_(std::make_unique<Impl>()) {
  const std::string& ep = options.endpoint;
  std::string host;
  int port = 0;
  DPAR_CHECK(dist::detail::split_host_port(ep, &host, &port, /*allow_port_zero=*/true),
             "ps server ", options.server_id, ": endpoint '", ep, "' is not ip:port");
  DPAR_CHECK(options.server_id >= 0 && options.server_id < options.num_servers, "ps server: id ",
             options.server_id, " out of range 0..", options.num_servers - 1);
  DPAR_CHECK(options.num_trainers >= 1, "ps server: needs at least one trainer, got ",
             options.num_trainers);
  const std::string name = "ps server " + std::to_string(options.server_id) + " (" + ep + ")";
  dist::detail::probe_bind(host, port, ep, name);

  impl_->state = std::make_unique<detail::ShardState>(
      detail::ShardState::Config{options.server_id, options.num_servers, options.num_trainers,
                                 options.timeout, name, options.log});
  impl_->service = std::make_unique<PsService>(*impl_->state, name, options.job_token, options.log);
  int bound_port = 0;
  impl_->server = dist::detail::start_grpc_server(ep, impl_->service.get(),
                                                  detail::kMaxMessageBytes, name, &bound_port);
  // Port 0 (tests, fuzzers): the endpoint names the port the system picked.
  impl_->endpoint = port == 0 ? dist::detail::join_host_port(host, bound_port) : ep;
}

Server::~Server() {
  stop();
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    impl_->server->Wait();
    impl_->server.reset();
  }
}

void Server::run() {
  try {
    impl_->state->run();
  } catch (...) {
    // Waiting handlers have been woken with the failure. Keep answering a little longer (every
    // call now gets the reason), so trainers that call in the next moments print why the job
    // stopped rather than "connection refused"; then close.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    throw;
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  // Every trainer has finished: let the last Finish replies go out, then close.
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Server::stop() { impl_->state->stop(""); }

std::string Server::endpoint() const { return impl_->endpoint; }

}  // namespace dpar::ps
