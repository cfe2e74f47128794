#pragma once
// The trainer side of parameter-server training: ParameterServerTrainer wraps a Module and
// its optimizer. The optimizer's settings (SGD with or without momentum, AdamW) are sent to
// the servers, which run it on their shards; its learning rate (set by any LRScheduler) is
// sent with every push, so the schedule follows the trainer's step count.
//
//   ps::ParameterServerTrainer ps(model, optimizer, ps::env_from_environment());
//   for (...) { optimizer.zero_grad(); loss = ...; loss.backward(); ps.step(batch); sched.step(); }
//   ps.finish();
//
// Startup: trainer 0 sends its parameters to the servers (or, with resume_dir, has them
// restore their checkpointed shards); every other trainer waits for that, has its layout
// compared with trainer 0's, and pulls. After construction all trainers hold identical
// parameters. Buffers (BN running statistics) are not sent: each trainer keeps its own,
// computed from its own data, and trainer 0's are the ones exported (as in PaddlePaddle's PS
// mode, where batch-norm statistics stay local to the trainer).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpar/ps/layout.h"
#include "dpar/ps/ps_env.h"

namespace dpar::nn {
class Module;
}
namespace dpar::optim {
class Optimizer;
}

namespace dpar::ps {

using Millis = std::chrono::milliseconds;

enum class Mode { kSync, kAsync, kGeo };
// "sync" / "async" / "geo"; anything else throws dpar::Error listing the choices.
Mode parse_mode(const std::string& name);
const char* mode_name(Mode mode);

struct TrainerOptions {
  Mode mode = Mode::kSync;
  int64_t geo_k_steps = 10;    // geo: exchange deltas every k local steps
  int64_t max_staleness = -1;  // async: bound on how far other trainers may lag (< 0: none)
  int64_t block_size = kDefaultBlockSize;
  // How long to wait for the servers to come up ("pserver not ready" lines meanwhile).
  Millis connect_timeout{std::chrono::minutes(2)};
  // How long a pull may wait for a sync step / other trainers before failing.
  Millis timeout{std::chrono::minutes(5)};
  // Resume: servers restore the shards and optimizer state they saved in this directory (on
  // their own file system) at step `resume_step`, instead of taking trainer 0's parameters.
  std::string resume_dir;
  int64_t resume_step = 0;
  // Progress lines go here; empty: stderr.
  std::function<void(const std::string&)> log;
};

struct TrainerStats {
  int64_t bytes_pushed = 0;
  int64_t bytes_pulled = 0;
  double push_seconds = 0;
  double pull_seconds = 0;
};

class ParameterServerTrainer {
 public:
  // Connects to every server (retrying until connect_timeout), then initialises or pulls as
  // described above. Throws dpar::Error naming the server on any failure. The model's
  // parameters must be contiguous f32 CPU tensors; optimizer must be optim::SGD or
  // optim::AdamW over exactly model.parameters().
  ParameterServerTrainer(nn::Module& model, optim::Optimizer& optimizer, const PsEnv& env,
                         TrainerOptions options = {});
  ~ParameterServerTrainer();  // finish(), errors swallowed (call finish() to see them)
  ParameterServerTrainer(const ParameterServerTrainer&) = delete;
  ParameterServerTrainer& operator=(const ParameterServerTrainer&) = delete;

  // Call after backward() instead of optimizer.step(). sync/async: pushes the gradients
  // (weighted by `samples` in sync mode) with the optimizer's current lr to every server in
  // parallel and pulls the new parameters straight into the model. geo: optimizer.step()
  // locally; every geo_k_steps steps pushes the parameter change since the last exchange and
  // pulls the servers' values.
  void step(int64_t samples = 1);
  // Trainer 0: every server writes its shard and optimizer state to `dir` (on the server's
  // file system) tagged with the current step count, keeping each server's newest `keep`
  // files there (0: all). Returns the servers' file paths.
  std::vector<std::string> save(const std::string& dir, int keep = 0);
  // Tells every server this trainer is done (servers exit once all trainers are). Idempotent.
  void finish();

  int64_t steps() const;
  const ShardLayout& layout() const;
  const TrainerStats& stats() const;
  int trainer_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpar::ps
