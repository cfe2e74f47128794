#include "ps/shard_state.h"

#include <algorithm>
#include <cstring>
#include <iostream>

#include "dpar/core/error.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/sgd.h"
#include "ps/shard_checkpoint.h"

namespace dpar::ps::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string id_list(const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out;
}

[[noreturn]] void refuse(grpc::StatusCode code, std::string message) {
  throw CallError{code, std::move(message)};
}

}  // namespace

ShardState::ShardState(Config config) : config_(std::move(config)), started_(Clock::now()) {
  trainers_.resize(static_cast<size_t>(config_.num_trainers));
  for (TrainerSlot& t : trainers_) t.last_call = started_;
}

void ShardState::say(const std::string& line) const {
  if (config_.log) {
    config_.log(line);
  } else {
    std::cerr << line << std::endl;
  }
}

void ShardState::check_trainer(int trainer) const {
  if (trainer < 0 || trainer >= config_.num_trainers) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name + " serves trainers 0.." + std::to_string(config_.num_trainers - 1) +
               " (DPAR_TRAINERS_NUM=" + std::to_string(config_.num_trainers) + "), not trainer " +
               std::to_string(trainer));
  }
}

void ShardState::check_serving(std::unique_lock<std::mutex>&) const {
  if (phase_ == Phase::kFailed) refuse(grpc::StatusCode::ABORTED, failure_);
  if (phase_ == Phase::kDone) {
    refuse(grpc::StatusCode::ABORTED, config_.name + " has stopped (all trainers finished)");
  }
  if (phase_ == Phase::kWaitingForInit) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name + " is not initialised yet (trainer 0 initialises it)");
  }
}

void ShardState::fail(std::unique_lock<std::mutex>&, const std::string& why) {
  if (phase_ == Phase::kFailed || phase_ == Phase::kDone) return;
  phase_ = Phase::kFailed;
  failure_ = why;
  cv_.notify_all();
}

rpc::HelloReply ShardState::hello(int trainer, const rpc::HelloRequest& request) {
  check_trainer(trainer);
  if (request.server_id() != config_.server_id) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name + " is server " + std::to_string(config_.server_id) + ", but trainer " +
               std::to_string(trainer) + " dialled it as server " +
               std::to_string(request.server_id()) +
               " (every process must get the same server list in the same order)");
  }
  if (request.mode().num_trainers() != config_.num_trainers ||
      request.layout().num_servers() != config_.num_servers) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name + " was started for " + std::to_string(config_.num_servers) +
               " servers and " + std::to_string(config_.num_trainers) + " trainers, trainer " +
               std::to_string(trainer) + " expects " +
               std::to_string(request.layout().num_servers()) + " servers and " +
               std::to_string(request.mode().num_trainers()) + " trainers");
  }
  std::unique_lock<std::mutex> lock(mu_);
  trainers_[static_cast<size_t>(trainer)].last_call = Clock::now();
  if (request.wait_for_init()) {
    const auto deadline = Clock::now() + milliseconds(std::max<int64_t>(0, request.wait_init_ms()));
    cv_.wait_until(lock, deadline, [&] { return phase_ != Phase::kWaitingForInit; });
  }
  if (phase_ == Phase::kFailed) refuse(grpc::StatusCode::ABORTED, failure_);
  rpc::HelloReply reply;
  reply.set_server_id(config_.server_id);
  reply.set_initialized(phase_ != Phase::kWaitingForInit);
  reply.set_version(version_);
  const ShardLayout theirs = from_proto(request.layout());
  if (reply.initialized()) {
    if (std::string diff = layout_.first_difference(theirs); !diff.empty()) {
      refuse(grpc::StatusCode::FAILED_PRECONDITION,
             "trainer " + std::to_string(trainer) +
                 "'s parameter layout differs from trainer 0's: " + diff +
                 " (every trainer must build the same model)");
    }
    if (std::string diff = mode_difference(mode_, request.mode()); !diff.empty()) {
      refuse(grpc::StatusCode::FAILED_PRECONDITION, "trainer " + std::to_string(trainer) +
                                                        " runs with " + diff +
                                                        " of trainer 0 (give every trainer the "
                                                        "same ps settings)");
    }
  }
  const ElementRange r = theirs.shard(config_.server_id);
  reply.set_shard_begin(r.begin);
  reply.set_shard_end(r.end);
  return reply;
}

int64_t ShardState::begin_init(int trainer, const rpc::InitHeader& header) {
  check_trainer(trainer);
  if (trainer != 0) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           "only trainer 0 initialises the servers, trainer " + std::to_string(trainer) + " tried");
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (phase_ != Phase::kWaitingForInit || initialising_) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name +
               " was initialised already (a restarted trainer 0? restart the whole "
               "job, with --resume to continue)");
  }
  const ShardLayout layout = from_proto(header.layout());
  if (layout.num_servers() != config_.num_servers ||
      header.mode().num_trainers() != config_.num_trainers) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name + " was started for " + std::to_string(config_.num_servers) +
               " servers and " + std::to_string(config_.num_trainers) +
               " trainers, trainer 0 has " + std::to_string(layout.num_servers()) + " and " +
               std::to_string(header.mode().num_trainers()));
  }
  initialising_ = true;
  return layout.shard(config_.server_id).size();
}

int64_t ShardState::commit_init(int trainer, const rpc::InitHeader& header, Tensor values) {
  std::unique_lock<std::mutex> lock(mu_);
  initialising_ = false;
  if (phase_ != Phase::kWaitingForInit) check_serving(lock);
  layout_ = from_proto(header.layout());
  range_ = layout_.shard(config_.server_id);
  mode_ = header.mode();
  optimizer_config_ = header.optimizer();
  values_ = Tensor::zeros({range_.size()});
  values_.set_requires_grad(true);
  build_optimizer(optimizer_config_);
  if (!header.resume_dir().empty()) {
    restore(header.resume_dir(), header.resume_step());
    // Every trainer resumes at that step: their push counts (the staleness clocks) too.
    for (TrainerSlot& t : trainers_) t.clock = header.resume_step();
  } else {
    DPAR_CHECK(values.defined() && values.numel() == range_.size(), config_.name, ": init carried ",
               values.defined() ? values.numel() : 0, " of ", range_.size(), " elements");
    values_.detach().copy_(values);
  }
  phase_ = Phase::kServing;
  trainers_[static_cast<size_t>(trainer)].last_call = Clock::now();
  say(config_.name + ": initialised by trainer 0: " + mode_.mode() + " mode, " +
      std::to_string(config_.num_trainers) + " trainers, optimizer " + optimizer_config_.kind() +
      (header.resume_dir().empty() ? "" : ", resumed at step " + std::to_string(version_)) +
      ", shard [" + std::to_string(range_.begin) + ", " + std::to_string(range_.end) + ") of " +
      std::to_string(layout_.total()) + " floats");
  cv_.notify_all();
  return version_;
}

void ShardState::build_optimizer(const rpc::OptimizerConfig& c) {
  optimizer_.reset();
  if (mode_.mode() == "geo" || range_.size() == 0) return;  // geo: trainers optimise locally
  if (c.kind() == "sgd") {
    optimizer_ = std::make_unique<optim::SGD>(std::vector<Tensor>{values_},
                                              optim::SGDOptions{.lr = 0,
                                                                .momentum = c.momentum(),
                                                                .dampening = c.dampening(),
                                                                .weight_decay = c.weight_decay(),
                                                                .nesterov = c.nesterov()});
  } else if (c.kind() == "adamw") {
    optimizer_ = std::make_unique<optim::AdamW>(
        std::vector<Tensor>{values_}, optim::AdamWOptions{.lr = 0,
                                                          .beta1 = c.beta1(),
                                                          .beta2 = c.beta2(),
                                                          .eps = c.eps(),
                                                          .weight_decay = c.weight_decay()});
  } else {
    refuse(grpc::StatusCode::INVALID_ARGUMENT,
           config_.name + ": unknown optimizer '" + c.kind() + "' (expected sgd or adamw)");
  }
}

float* ShardState::begin_push(int trainer, const rpc::PushHeader& header) {
  check_trainer(trainer);
  std::unique_lock<std::mutex> lock(mu_);
  check_serving(lock);
  TrainerSlot& slot = trainers_[static_cast<size_t>(trainer)];
  slot.last_call = Clock::now();
  const std::string who = "trainer " + std::to_string(trainer);
  if (slot.finished) refuse(grpc::StatusCode::FAILED_PRECONDITION, who + " pushed after finishing");
  if (slot.pushing) refuse(grpc::StatusCode::FAILED_PRECONDITION, who + " has a push in flight");
  if (mode_.mode() == "sync" && (header.step() != version_ || slot.pushed)) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name + ": " + who + " pushed its gradient for step " +
               std::to_string(header.step()) + ", but the server is at step " +
               std::to_string(version_) + (slot.pushed ? " and has that trainer's gradient" : ""));
  }
  if (!slot.staging.defined()) slot.staging = Tensor::zeros({range_.size()});
  slot.pushing = true;
  slot.weight = header.weight() > 0 ? header.weight() : 1.0;
  slot.lr = header.lr();
  return range_.size() ? slot.staging.data<float>() : nullptr;
}

int64_t ShardState::shard_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return range_.size();
}

void ShardState::abort_push(int trainer) {
  std::unique_lock<std::mutex> lock(mu_);
  trainers_[static_cast<size_t>(trainer)].pushing = false;
}

int64_t ShardState::end_push(int trainer, int64_t received) {
  std::unique_lock<std::mutex> lock(mu_);
  TrainerSlot& slot = trainers_[static_cast<size_t>(trainer)];
  slot.pushing = false;
  slot.last_call = Clock::now();
  check_serving(lock);
  if (received != range_.size()) {
    refuse(grpc::StatusCode::INVALID_ARGUMENT,
           config_.name + ": the push of trainer " + std::to_string(trainer) + " carried " +
               std::to_string(received) + " of " + std::to_string(range_.size()) + " elements");
  }
  if (mode_.mode() == "sync") {
    slot.pushed = true;
    if (!step_open_since_) step_open_since_ = Clock::now();
    if (sync_step_complete()) apply_sync_step(lock);
  } else {
    if (mode_.mode() == "geo") {
      // Model averaging: each trainer's change counts 1/trainers.
      const float scale = 1.0f / static_cast<float>(config_.num_trainers);
      float* v = range_.size() ? values_.data<float>() : nullptr;
      const float* d = range_.size() ? slot.staging.data<float>() : nullptr;
      for (int64_t i = 0; i < range_.size(); ++i) v[i] += scale * d[i];
    } else {
      apply_gradient(slot.staging, slot.lr);
    }
    ++version_;
    ++slot.clock;
    cv_.notify_all();
  }
  return version_;
}

bool ShardState::sync_step_complete() const {
  bool any = false;
  for (const TrainerSlot& t : trainers_) {
    if (t.finished) continue;
    if (!t.pushed) return false;
    any = true;
  }
  return any;
}

std::vector<int> ShardState::missing_sync_trainers() const {
  std::vector<int> out;
  for (size_t i = 0; i < trainers_.size(); ++i) {
    if (!trainers_[i].finished && !trainers_[i].pushed) out.push_back(static_cast<int>(i));
  }
  return out;
}

void ShardState::apply_sync_step(std::unique_lock<std::mutex>&) {
  // Sample-weighted average, summed in trainer order so the result does not depend on which
  // push arrived first.
  double total = 0;
  double lr = 0;
  for (const TrainerSlot& t : trainers_) {
    if (t.pushed) {
      if (total == 0) lr = t.lr;
      total += t.weight;
    }
  }
  const int64_t n = range_.size();
  if (n > 0) {
    Tensor grad;
    for (TrainerSlot& t : trainers_) {
      if (!t.pushed) continue;
      const float share = static_cast<float>(t.weight / total);
      const float* g = t.staging.data<float>();
      if (!grad.defined()) {
        grad = t.staging;  // reused in place: its pushes for this step are complete
        float* out = grad.data<float>();
        for (int64_t i = 0; i < n; ++i) out[i] = share * g[i];
      } else {
        float* out = grad.data<float>();
        for (int64_t i = 0; i < n; ++i) out[i] += share * g[i];
      }
    }
    apply_gradient(grad, lr);
  }
  for (TrainerSlot& t : trainers_) {
    if (t.pushed) ++t.clock;
    t.pushed = false;
  }
  ++version_;
  step_open_since_.reset();
  cv_.notify_all();
}

void ShardState::apply_gradient(const Tensor& gradient, double lr) {
  if (!optimizer_) return;
  values_.set_grad(gradient);
  optimizer_->set_lr(lr);
  optimizer_->step();
}

std::vector<int> ShardState::lagging_trainers(int trainer, int64_t step) const {
  std::vector<int> out;
  if (mode_.mode() != "async" || mode_.max_staleness() < 0) return out;
  for (size_t i = 0; i < trainers_.size(); ++i) {
    const TrainerSlot& t = trainers_[i];
    if (static_cast<int>(i) == trainer || t.finished) continue;
    if (t.clock < step - mode_.max_staleness()) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<rpc::PullMessage> ShardState::pull(int trainer, const rpc::PullRequest& request,
                                               const grpc::ServerContext* context) {
  check_trainer(trainer);
  std::unique_lock<std::mutex> lock(mu_);
  trainers_[static_cast<size_t>(trainer)].last_call = Clock::now();
  const auto start = Clock::now();
  const auto deadline = start + milliseconds(std::max<int64_t>(0, request.timeout_ms()));
  while (true) {
    check_serving(lock);
    const bool ready = mode_.mode() == "sync" ? version_ >= request.min_version()
                                              : lagging_trainers(trainer, request.step()).empty();
    if (ready) break;
    const auto now = Clock::now();
    if (now >= deadline) {
      const auto waited = std::chrono::duration_cast<milliseconds>(now - start);
      if (mode_.mode() == "sync") {
        refuse(grpc::StatusCode::DEADLINE_EXCEEDED,
               config_.name + ": step " + std::to_string(version_) +
                   " still lacks the gradients of trainer(s) " + id_list(missing_sync_trainers()) +
                   " after " + seconds_text(waited) + " (did they stop or die?)");
      }
      refuse(grpc::StatusCode::DEADLINE_EXCEEDED,
             config_.name + ": trainer(s) " + id_list(lagging_trainers(trainer, request.step())) +
                 " lag more than " + std::to_string(mode_.max_staleness()) +
                 " steps behind trainer " + std::to_string(trainer) + " after " +
                 seconds_text(waited));
    }
    if (context && context->IsCancelled()) refuse(grpc::StatusCode::CANCELLED, "cancelled");
    cv_.wait_until(lock, std::min(deadline, now + std::chrono::seconds(1)));
  }
  std::vector<rpc::PullMessage> out;
  const int64_t n = range_.size();
  const char* bytes = n ? static_cast<const char*>(values_.raw_data()) : nullptr;
  for (int64_t off = 0; off < n || out.empty(); off += kChunkElements) {
    rpc::PullMessage& m = out.emplace_back();
    const int64_t len = std::min(kChunkElements, n - off);
    m.set_offset(off);
    if (len > 0) m.set_data(bytes + off * 4, static_cast<size_t>(len) * 4);
  }
  out.front().set_version(version_);
  for (rpc::PullMessage& m : out) m.set_crc32c(chunk_checksum(m));
  return out;
}

std::string ShardState::save(int trainer, const std::string& dir, int64_t step, int keep) {
  check_trainer(trainer);
  std::unique_lock<std::mutex> lock(mu_);
  check_serving(lock);
  ShardCheckpoint ckpt{config_.server_id,
                       config_.num_servers,
                       step,
                       version_,
                       layout_,
                       mode_.mode(),
                       optimizer_config_.kind(),
                       values_.detach(),
                       optimizer_ ? optimizer_->state_dict() : optim::StateDict{}};
  return write_shard_checkpoint(dir, ckpt, keep);
}

void ShardState::restore(const std::string& dir, int64_t step) {
  const std::string path = shard_checkpoint_path(dir, config_.server_id, step);
  ShardCheckpoint ckpt = read_shard_checkpoint(path);
  auto mismatch = [&](const std::string& what) {
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           config_.name + ": cannot resume from " + path + ": " + what);
  };
  if (ckpt.server_id != config_.server_id || ckpt.num_servers != config_.num_servers) {
    mismatch("it is server " + std::to_string(ckpt.server_id) + " of " +
             std::to_string(ckpt.num_servers) + ", this is server " +
             std::to_string(config_.server_id) + " of " + std::to_string(config_.num_servers));
  }
  if (std::string diff = layout_.first_difference(ckpt.layout); !diff.empty()) {
    mismatch("its parameter layout differs: " + diff);
  }
  if (ckpt.mode != mode_.mode() || ckpt.optimizer != optimizer_config_.kind()) {
    mismatch("it was written in " + ckpt.mode + " mode with optimizer " + ckpt.optimizer +
             ", this job runs " + mode_.mode() + " with " + optimizer_config_.kind());
  }
  values_.detach().copy_(ckpt.values);
  if (optimizer_) optimizer_->load_state_dict(ckpt.optimizer_state);
  version_ = ckpt.version;
}

int ShardState::finish(int trainer, bool aborted) {
  check_trainer(trainer);
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted) {
    // Often the error is another trainer's absence (a timed-out sync step): say so too.
    const std::vector<int> missing =
        step_open_since_ ? missing_sync_trainers() : std::vector<int>{};
    fail(lock,
         config_.name + ": trainer " + std::to_string(trainer) +
             " stopped with an error (see its log)" +
             (missing.empty() ? std::string()
                              : " while step " + std::to_string(version_) +
                                    " lacked the gradients of trainer(s) " + id_list(missing)) +
             "; stopping the job");
    return 0;
  }
  TrainerSlot& slot = trainers_[static_cast<size_t>(trainer)];
  slot.finished = true;
  slot.pushed = false;
  int left = 0;
  for (const TrainerSlot& t : trainers_) left += t.finished ? 0 : 1;
  if (left == 0 && phase_ != Phase::kFailed) {
    phase_ = Phase::kDone;
    say(config_.name + ": all " + std::to_string(config_.num_trainers) +
        " trainers finished at version " + std::to_string(version_) + "; stopping");
  } else if (phase_ == Phase::kServing && mode_.mode() == "sync" && sync_step_complete()) {
    apply_sync_step(lock);  // the others were waiting only for this trainer
  }
  cv_.notify_all();
  return left;
}

void ShardState::ping(int trainer) {
  check_trainer(trainer);
  std::lock_guard<std::mutex> lock(mu_);
  trainers_[static_cast<size_t>(trainer)].last_call = Clock::now();
}

void ShardState::stop(const std::string& why) {
  std::unique_lock<std::mutex> lock(mu_);
  if (why.empty()) {
    if (phase_ != Phase::kFailed) phase_ = Phase::kDone;
    cv_.notify_all();
  } else {
    fail(lock, why);
  }
}

void ShardState::run() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto limit = config_.timeout;
  while (true) {
    if (phase_ == Phase::kDone) return;
    if (phase_ == Phase::kFailed) DPAR_FAIL(failure_);
    const auto now = Clock::now();
    if (phase_ == Phase::kWaitingForInit && now - started_ > limit) {
      fail(lock, config_.name + ": trainer 0 did not initialise the server within " +
                     seconds_text(limit) + " of its start");
      continue;
    }
    if (phase_ == Phase::kServing && step_open_since_ && now - *step_open_since_ > limit) {
      fail(lock, config_.name + ": step " + std::to_string(version_) +
                     " still lacks the gradients of trainer(s) " +
                     id_list(missing_sync_trainers()) + " after " + seconds_text(limit) +
                     " (did they stop or die?)");
      continue;
    }
    if (phase_ == Phase::kServing) {
      std::vector<int> silent;
      bool anyone_recent = false;
      for (size_t i = 0; i < trainers_.size(); ++i) {
        if (trainers_[i].finished) continue;
        if (now - trainers_[i].last_call > limit) {
          silent.push_back(static_cast<int>(i));
        } else {
          anyone_recent = true;
        }
      }
      if (!anyone_recent && !silent.empty()) {
        fail(lock, config_.name + ": no call from trainer(s) " + id_list(silent) + " for " +
                       seconds_text(limit) + " (did they die?)");
        continue;
      }
    }
    cv_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

}  // namespace dpar::ps::detail
