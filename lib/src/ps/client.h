#pragma once
// The trainer's connections to all parameter servers. Every operation is issued to all servers
// at once (one thread per server, the calling thread taking server 0) and awaited together;
// the first failure, in server order, is rethrown as a dpar::Error naming that server.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dpar/ps/layout.h"
#include "dpar/tensor/tensor.h"
#include "ps/ps_common.h"

namespace dpar::ps::detail {

// A list of contiguous f32 tensors seen as one flat vector (parameters or gradients, in
// layout order): copies between a range of it and a byte buffer without staging the rest.
class FlatView {
 public:
  FlatView() = default;
  explicit FlatView(const std::vector<Tensor>& tensors);
  int64_t size() const { return total_; }
  void gather(int64_t begin, int64_t count, float* out) const;
  void scatter(int64_t begin, int64_t count, const float* in) const;

 private:
  std::vector<float*> data_;
  std::vector<int64_t> offsets_;  // start of each tensor in the flat vector, plus the total
  int64_t total_ = 0;
};

struct ClientOptions {
  std::vector<std::string> endpoints;
  int trainer_id = 0;
  std::string token;
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(2)};
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::function<void(const std::string&)> log;
};

class PsClient {
 public:
  PsClient(ClientOptions options, ShardLayout layout, rpc::ModeConfig mode);
  ~PsClient();

  // Hello to every server, retrying ("pserver not ready: ...") until connect_timeout. With
  // wait_for_init, also waits (up to timeout) until trainer 0 has initialised each server and
  // has the server compare this trainer's layout and mode with trainer 0's.
  void connect(bool wait_for_init);
  // Trainer 0: sends the header and (unless resuming) each server's range of `params`.
  void init(const rpc::InitHeader& header, const FlatView& params);
  // Streams each server's range of `source`; returns the lowest version the servers reported.
  int64_t push(const rpc::PushHeader& header, const FlatView& source);
  // Receives each server's shard into `sink` (waiting as the mode requires); returns the
  // lowest version among the servers.
  int64_t pull(int64_t min_version, int64_t step, const FlatView& sink);
  std::vector<std::string> save(const std::string& dir, int64_t step, int keep);
  // aborted: this trainer is failing; the servers fail the job instead of counting it done.
  void finish(bool aborted = false);
  // A sign of life to every server (errors ignored: the next real call reports them).
  void ping();

  int64_t bytes_pushed() const { return bytes_pushed_; }
  int64_t bytes_pulled() const { return bytes_pulled_; }

 private:
  struct Conn;
  struct Call;
  // Runs body(s) for every server at once. The first failure cancels the calls still in
  // flight (a dead server must not leave the trainer waiting out its siblings' timeouts) and
  // is rethrown.
  void for_each_server(const std::function<void(size_t)>& body);
  void cancel_calls();
  void prepare(grpc::ClientContext& ctx, std::chrono::milliseconds deadline) const;
  // "ps trainer <id>, <call>: ps server <s> (<endpoint>) ...": the failure of `call` on a server.
  std::string describe(size_t server, const char* call, const grpc::Status& status) const;
  void say(const std::string& line) const;

  ClientOptions options_;
  ShardLayout layout_;
  rpc::ModeConfig mode_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::mutex calls_mu_;
  std::set<grpc::ClientContext*> calls_;  // contexts of the calls in flight
  std::atomic<bool> abandon_{false};      // a sibling call failed: stop retrying
  int64_t bytes_pushed_ = 0;
  int64_t bytes_pulled_ = 0;
};

}  // namespace dpar::ps::detail
