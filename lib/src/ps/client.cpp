#include "ps/client.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <iostream>
#include <thread>

#include "dpar/core/error.h"

namespace dpar::ps::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t whole_seconds(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

}  // namespace

FlatView::FlatView(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    DPAR_CHECK(t.dtype() == DType::f32 && t.device().is_cpu() && t.is_contiguous(),
               "ps: parameters and gradients must be contiguous f32 CPU tensors, got ", t.str());
    data_.push_back(t.numel() ? t.data<float>() : nullptr);
    offsets_.push_back(total_);
    total_ += t.numel();
  }
  offsets_.push_back(total_);
}

// The tensors overlapping [begin, begin+count), each with the overlapping part.
template <class Copy>
static void for_each_piece(const std::vector<int64_t>& offsets, int64_t begin, int64_t count,
                           Copy copy) {
  auto it = std::upper_bound(offsets.begin(), offsets.end() - 1, begin);
  size_t i = static_cast<size_t>(it - offsets.begin()) - 1;
  int64_t done = 0;
  while (done < count) {
    const int64_t pos = begin + done;
    while (offsets[i + 1] <= pos) ++i;
    const int64_t take = std::min(count - done, offsets[i + 1] - pos);
    copy(i, pos - offsets[i], done, take);
    done += take;
  }
}

void FlatView::gather(int64_t begin, int64_t count, float* out) const {
  DPAR_CHECK(begin >= 0 && begin + count <= total_, "ps: range [", begin, ", ", begin + count,
             ") outside a flat vector of ", total_);
  for_each_piece(offsets_, begin, count, [&](size_t t, int64_t at, int64_t to, int64_t n) {
    std::memcpy(out + to, data_[t] + at, static_cast<size_t>(n) * 4);
  });
}

void FlatView::scatter(int64_t begin, int64_t count, const float* in) const {
  DPAR_CHECK(begin >= 0 && begin + count <= total_, "ps: range [", begin, ", ", begin + count,
             ") outside a flat vector of ", total_);
  for_each_piece(offsets_, begin, count, [&](size_t t, int64_t at, int64_t from, int64_t n) {
    std::memcpy(data_[t] + at, in + from, static_cast<size_t>(n) * 4);
  });
}

// Streams `count` elements of `source` from `begin` in chunks; `msg` carries the header, which
// goes out with the first chunk only. The one copy on this side: straight from the tensors into
// the message. At least one message is sent, so an empty shard still delivers its header.
template <class Message, class Writer>
void write_chunks(Writer& writer, Message& msg, const FlatView& source, int64_t begin,
                  int64_t count) {
  int64_t off = 0;
  do {
    const int64_t len = std::min(kChunkElements, count - off);
    msg.set_offset(off);
    msg.mutable_data()->resize(static_cast<size_t>(len) * 4);
    if (len > 0) {
      source.gather(begin + off, len, reinterpret_cast<float*>(msg.mutable_data()->data()));
    }
    msg.set_crc32c(chunk_checksum(msg));
    if (!writer.Write(msg)) break;  // the server ended the call; Finish() says why
    msg.clear_header();
    off += len;
  } while (off < count);
  writer.WritesDone();
}

// One RPC's context, registered while the call lives so that a failing sibling can cancel it.
struct PsClient::Call {
  Call(PsClient& client, milliseconds deadline) : owner(client) {
    owner.prepare(ctx, deadline);
    std::lock_guard<std::mutex> lock(owner.calls_mu_);
    owner.calls_.insert(&ctx);
  }
  ~Call() {
    std::lock_guard<std::mutex> lock(owner.calls_mu_);
    owner.calls_.erase(&ctx);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  PsClient& owner;
  grpc::ClientContext ctx;
};

struct PsClient::Conn {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<rpc::ParameterServer::Stub> stub;
  ElementRange range;
};

PsClient::PsClient(ClientOptions options, ShardLayout layout, rpc::ModeConfig mode)
    : options_(std::move(options)), layout_(std::move(layout)), mode_(std::move(mode)) {
  DPAR_CHECK(static_cast<int>(options_.endpoints.size()) == layout_.num_servers(),
             "ps: ", options_.endpoints.size(), " server endpoints for a layout over ",
             layout_.num_servers(), " servers");
  for (size_t s = 0; s < options_.endpoints.size(); ++s) {
    auto conn = std::make_unique<Conn>();
    conn->endpoint = options_.endpoints[s];
    conn->channel = make_channel(conn->endpoint);
    conn->stub = rpc::ParameterServer::NewStub(conn->channel);
    conn->range = layout_.shard(static_cast<int>(s));
    conns_.push_back(std::move(conn));
  }
}

PsClient::~PsClient() = default;

void PsClient::say(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << line << std::endl;
  }
}

void PsClient::prepare(grpc::ClientContext& ctx, milliseconds deadline) const {
  ctx.AddMetadata(kTokenKey, options_.token);
  ctx.AddMetadata(kTrainerKey, std::to_string(options_.trainer_id));
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
}

std::string PsClient::describe(size_t server, const char* call, const grpc::Status& status) const {
  // Every failure names this trainer and the call, so a job's logs say which rank and op broke.
  const std::string prefix =
      "ps trainer " + std::to_string(options_.trainer_id) + ", " + call + ": ";
  const std::string who =
      "ps server " + std::to_string(server) + " (" + conns_[server]->endpoint + ")";
  const std::string& msg = status.error_message();
  // The server's own refusals already name it and say why.
  if (msg.rfind("ps server", 0) == 0 || msg.rfind("trainer", 0) == 0) return prefix + msg;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return prefix + who + " is unreachable (did it die?): " + msg;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return prefix + who + " did not answer in time (" + msg + ")";
    default:
      return prefix + who + ": " + msg;
  }
}

void PsClient::cancel_calls() {
  abandon_ = true;
  std::lock_guard<std::mutex> lock(calls_mu_);
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
}

void PsClient::for_each_server(const std::function<void(size_t)>& body) {
  abandon_ = false;
  std::mutex mu;
  std::exception_ptr first;  // the failure that happened first, not the lowest server's
  auto run = [&](size_t s) {
    try {
      body(s);
    } catch (...) {
      bool is_first = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        is_first = !first;
        if (is_first) first = std::current_exception();
      }
      if (is_first) cancel_calls();
    }
  };
  std::vector<std::thread> threads;
  for (size_t s = 1; s < conns_.size(); ++s) threads.emplace_back(run, s);
  run(0);
  for (std::thread& t : threads) t.join();
  abandon_ = false;
  if (first) std::rethrow_exception(first);
}

void PsClient::connect(bool wait_for_init) {
  for_each_server([&](size_t s) {
    Conn& c = *conns_[s];
    rpc::HelloRequest req;
    req.set_trainer_id(options_.trainer_id);
    req.set_server_id(static_cast<int>(s));
    *req.mutable_layout() = to_proto(layout_);
    *req.mutable_mode() = mode_;
    const auto start = Clock::now();
    auto next_note = start + std::chrono::seconds(3);
    rpc::HelloReply rep;
    while (true) {
      if (abandon_) DPAR_FAIL("ps: connecting to ", c.endpoint, " abandoned");
      Call call(*this, milliseconds(1000));
      grpc::ClientContext& ctx = call.ctx;
      ctx.set_wait_for_ready(true);  // wait for the listener instead of failing at once
      const grpc::Status st = c.stub->Hello(&ctx, req, &rep);
      if (st.ok()) break;
      const bool not_up = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                          st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (!not_up) DPAR_FAIL(describe(s, "hello", st));
      const auto now = Clock::now();
      if (now - start >= options_.connect_timeout) {
        DPAR_FAIL("pserver not ready: ", c.endpoint, " did not answer within ",
                  seconds_text(options_.connect_timeout),
                  " (--ps-connect-timeout); is the server running and reachable from here?");
      }
      if (now >= next_note) {
        say("pserver not ready: " + c.endpoint + " (retrying, " +
            std::to_string(whole_seconds(now - start)) + " s elapsed)");
        next_note += std::chrono::seconds(3);
      }
    }
    DPAR_CHECK(rep.shard_begin() == c.range.begin && rep.shard_end() == c.range.end,
               "ps: ", c.endpoint, " computes shard [", rep.shard_begin(), ", ", rep.shard_end(),
               ") for this layout, this trainer [", c.range.begin, ", ", c.range.end, ")");
    if (!wait_for_init || rep.initialized()) return;
    req.set_wait_for_init(true);
    req.set_wait_init_ms(5000);
    const auto wait_start = Clock::now();
    while (!rep.initialized()) {
      if (Clock::now() - wait_start >= options_.timeout) {
        DPAR_FAIL("ps: trainer 0 did not initialise ", c.endpoint, " within ",
                  seconds_text(options_.timeout), " (is trainer 0 running?)");
      }
      if (abandon_) DPAR_FAIL("ps: waiting for ", c.endpoint, " abandoned");
      Call call(*this, milliseconds(15000));
      grpc::ClientContext& ctx = call.ctx;
      const grpc::Status st = c.stub->Hello(&ctx, req, &rep);
      if (!st.ok()) DPAR_FAIL(describe(s, "hello", st));
      if (!rep.initialized()) {
        say("waiting for trainer 0 to initialise " + c.endpoint + " (" +
            std::to_string(whole_seconds(Clock::now() - wait_start)) + " s)");
      }
    }
  });
}

void PsClient::init(const rpc::InitHeader& header, const FlatView& params) {
  for_each_server([&](size_t s) {
    Conn& c = *conns_[s];
    Call call(*this, options_.timeout);
    grpc::ClientContext& ctx = call.ctx;
    rpc::InitReply rep;
    auto writer = c.stub->Init(&ctx, &rep);
    rpc::InitMessage msg;
    *msg.mutable_header() = header;
    const int64_t n = header.resume_dir().empty() ? c.range.size() : 0;
    write_chunks(*writer, msg, params, c.range.begin, n);
    const grpc::Status st = writer->Finish();
    if (!st.ok()) DPAR_FAIL(describe(s, "init", st));
  });
}

int64_t PsClient::push(const rpc::PushHeader& header, const FlatView& source) {
  std::vector<int64_t> versions(conns_.size(), 0);
  for_each_server([&](size_t s) {
    Conn& c = *conns_[s];
    Call call(*this, options_.timeout);
    grpc::ClientContext& ctx = call.ctx;
    rpc::PushReply rep;
    auto writer = c.stub->Push(&ctx, &rep);
    rpc::PushMessage msg;
    *msg.mutable_header() = header;
    write_chunks(*writer, msg, source, c.range.begin, c.range.size());
    const grpc::Status st = writer->Finish();
    if (!st.ok()) DPAR_FAIL(describe(s, "push", st));
    versions[s] = rep.version();
  });
  for (const auto& c : conns_) bytes_pushed_ += c->range.size() * 4;
  return *std::min_element(versions.begin(), versions.end());
}

int64_t PsClient::pull(int64_t min_version, int64_t step, const FlatView& sink) {
  std::vector<int64_t> versions(conns_.size(), 0);
  for_each_server([&](size_t s) {
    Conn& c = *conns_[s];
    // A little longer than the server's own wait, so its message (naming the trainers it is
    // waiting for) arrives instead of a bare deadline.
    Call call(*this, options_.timeout + milliseconds(10000));
    grpc::ClientContext& ctx = call.ctx;
    rpc::PullRequest req;
    req.set_min_version(min_version);
    req.set_step(step);
    req.set_timeout_ms(options_.timeout.count());
    auto reader = c.stub->Pull(&ctx, req);
    rpc::PullMessage msg;
    int64_t received = 0;
    bool first = true;
    while (reader->Read(&msg)) {
      if (first) versions[s] = msg.version();
      first = false;
      const int64_t len = static_cast<int64_t>(msg.data().size() / 4);
      // Checked before a byte of it reaches the parameters.
      const uint32_t expected = chunk_checksum(msg);
      if (msg.crc32c() != expected) {
        ctx.TryCancel();
        DPAR_FAIL(
            "ps trainer ", options_.trainer_id, ", pull from ps server ", s, " (", c.endpoint,
            "): ",
            corrupted_chunk("a pulled", msg.offset(), msg.data().size(), msg.crc32c(), expected),
            "; the parameters were not updated from it");
      }
      DPAR_CHECK(msg.offset() >= 0 && msg.offset() + len <= c.range.size(), "ps: ", c.endpoint,
                 " sent a chunk outside its shard");
      // Straight from the message into the parameters.
      if (len > 0)
        sink.scatter(c.range.begin + msg.offset(), len,
                     reinterpret_cast<const float*>(msg.data().data()));
      received += len;
    }
    const grpc::Status st = reader->Finish();
    if (!st.ok()) DPAR_FAIL(describe(s, "pull", st));
    DPAR_CHECK(received == c.range.size(), "ps: ", c.endpoint, " sent ", received, " of ",
               c.range.size(), " floats");
  });
  for (const auto& c : conns_) bytes_pulled_ += c->range.size() * 4;
  return *std::min_element(versions.begin(), versions.end());
}

std::vector<std::string> PsClient::save(const std::string& dir, int64_t step, int keep) {
  std::vector<std::string> paths(conns_.size());
  for_each_server([&](size_t s) {
    Call call(*this, options_.timeout);
    grpc::ClientContext& ctx = call.ctx;
    rpc::SaveRequest req;
    req.set_dir(dir);
    req.set_step(step);
    req.set_keep(keep);
    rpc::SaveReply rep;
    const grpc::Status st = conns_[s]->stub->Save(&ctx, req, &rep);
    if (!st.ok()) DPAR_FAIL(describe(s, "save", st));
    paths[s] = rep.path();
  });
  return paths;
}

void PsClient::finish(bool aborted) {
  for_each_server([&](size_t s) {
    Call call(*this, milliseconds(aborted ? 5000 : 30000));
    rpc::FinishRequest req;
    req.set_aborted(aborted);
    rpc::FinishReply rep;
    const grpc::Status st = conns_[s]->stub->Finish(&call.ctx, req, &rep);
    if (!st.ok()) DPAR_FAIL(describe(s, "finish", st));
  });
}

void PsClient::ping() {
  for (const auto& conn : conns_) {
    Call call(*this, milliseconds(5000));
    rpc::PingReply rep;
    conn->stub->Ping(&call.ctx, rpc::PingRequest(), &rep);
  }
}

}  // namespace dpar::ps::detail
