#pragma once
// The state of one parameter server, apart from gRPC: the shard, its optimizer, the sync-step
// bookkeeping, staleness clocks and who has finished. The service (server.cpp) turns calls
// into these methods and CallError into gRPC statuses. Every method is thread-safe; the ones
// that wait (hello with wait_for_init, pull) sleep on one condition variable that every state
// change notifies.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dpar/optim/optimizer.h"
#include "dpar/ps/layout.h"
#include "dpar/tensor/tensor.h"
#include "ps/ps_common.h"

namespace dpar::ps::detail {

// A refused call: the status code and the message the trainer will print.
struct CallError {
  grpc::StatusCode code;
  std::string message;
};

class ShardState {
 public:
  struct Config {
    int server_id = 0;
    int num_servers = 1;
    int num_trainers = 1;
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    std::string name;  // "ps server 0 (127.0.0.1:6070)", for messages
    std::function<void(const std::string&)> log;
  };
  explicit ShardState(Config config);

  rpc::HelloReply hello(int trainer, const rpc::HelloRequest& request);
  // Init from trainer 0: validates the header and returns the shard's element count, so the
  // caller can stage the streamed values; commit_init() then installs them (or, resuming,
  // restores the shard from the server's checkpoint and ignores `values`).
  int64_t begin_init(int trainer, const rpc::InitHeader& header);
  int64_t commit_init(int trainer, const rpc::InitHeader& header, Tensor values);

  // Push: begin_push() checks the header and returns the trainer's staging buffer (one shard of
  // f32) for the chunks; end_push() applies it once `received` covers the whole shard.
  float* begin_push(int trainer, const rpc::PushHeader& header);
  int64_t end_push(int trainer, int64_t received);
  void abort_push(int trainer);
  int64_t shard_size() const;  // elements of this server's shard (0 before init)

  // Waits as the mode requires, then returns the shard as messages (version in the first).
  std::vector<rpc::PullMessage> pull(int trainer, const rpc::PullRequest& request,
                                     const grpc::ServerContext* context);
  std::string save(int trainer, const std::string& dir, int64_t step, int keep);
  int finish(int trainer, bool aborted);
  void ping(int trainer);  // only marks the trainer alive

  // The watchdog: returns once every trainer has finished; throws dpar::Error when the job
  // failed (a sync step or the whole job stalled past the timeout) or stop() gave a reason.
  void run();
  void stop(const std::string& why);

 private:
  enum class Phase { kWaitingForInit, kServing, kDone, kFailed };

  void check_trainer(int trainer) const;
  void check_serving(std::unique_lock<std::mutex>& lock) const;
  void fail(std::unique_lock<std::mutex>& lock, const std::string& why);
  void apply_sync_step(std::unique_lock<std::mutex>& lock);
  void apply_gradient(const Tensor& gradient, double lr);
  bool sync_step_complete() const;
  std::vector<int> missing_sync_trainers() const;
  std::vector<int> lagging_trainers(int trainer, int64_t step) const;
  void build_optimizer(const rpc::OptimizerConfig& config);
  void restore(const std::string& dir, int64_t step);
  void say(const std::string& line) const;

  const Config config_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Phase phase_ = Phase::kWaitingForInit;
  bool initialising_ = false;  // an Init stream is between begin_init and commit_init
  std::string failure_;
  ShardLayout layout_;
  ElementRange range_;
  rpc::ModeConfig mode_;
  rpc::OptimizerConfig optimizer_config_;
  Tensor values_;  // the shard, 1-D f32; the optimizer's only parameter
  std::unique_ptr<optim::Optimizer> optimizer_;
  int64_t version_ = 0;  // optimizer steps (sync, async) or delta merges (geo) applied

  struct TrainerSlot {
    Tensor staging;  // one shard of f32: the gradient or delta being pushed
    bool pushing = false;
    bool pushed = false;  // sync: its gradient for step version_ is staged
    double weight = 0;
    double lr = 0;
    int64_t clock = 0;  // pushes applied
    bool finished = false;
    std::chrono::steady_clock::time_point last_call;
  };
  std::vector<TrainerSlot> trainers_;
  std::chrono::steady_clock::time_point started_;
  std::optional<std::chrono::steady_clock::time_point> step_open_since_;  // sync
};

}  // namespace dpar::ps::detail
