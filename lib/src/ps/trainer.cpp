#include "dpar/ps/trainer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>
#include <thread>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/error.h"
#include "dpar/nn/module.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/sgd.h"
#include "ps/client.h"

namespace dpar::ps {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The optimizer settings the servers will run, read off the trainer's optimizer object.
detail::rpc::OptimizerConfig server_optimizer(const optim::Optimizer& optimizer) {
  detail::rpc::OptimizerConfig c;
  if (auto* sgd = dynamic_cast<const optim::SGD*>(&optimizer)) {
    const optim::SGDOptions& o = sgd->options();
    c.set_kind("sgd");
    c.set_momentum(o.momentum);
    c.set_dampening(o.dampening);
    c.set_weight_decay(o.weight_decay);
    c.set_nesterov(o.nesterov);
  } else if (auto* adamw = dynamic_cast<const optim::AdamW*>(&optimizer)) {
    const optim::AdamWOptions& o = adamw->options();
    c.set_kind("adamw");
    c.set_beta1(o.beta1);
    c.set_beta2(o.beta2);
    c.set_eps(o.eps);
    c.set_weight_decay(o.weight_decay);
  } else {
    DPAR_FAIL(
        "ps: parameter servers run SGD (plain or momentum) and AdamW (Adam when weight "
        "decay is 0); the trainer's optimizer is ",
        optimizer.name());
  }
  return c;
}

}  // namespace

Mode parse_mode(const std::string& name) {
  if (name == "sync") return Mode::kSync;
  if (name == "async") return Mode::kAsync;
  if (name == "geo") return Mode::kGeo;
  DPAR_FAIL("ps: unknown mode '", name, "' (expected sync, async or geo)");
}

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kSync:
      return "sync";
    case Mode::kAsync:
      return "async";
    case Mode::kGeo:
      return "geo";
  }
  return "?";
}

struct ParameterServerTrainer::Impl {
  nn::Module& model;
  optim::Optimizer& optimizer;
  TrainerOptions options;
  int trainer_id = 0;
  std::vector<std::string> names;
  std::vector<Tensor> params;
  ShardLayout layout;
  detail::FlatView param_view;
  std::unique_ptr<detail::PsClient> client;
  int64_t steps = 0;
  bool finished = false;
  TrainerStats stats;
  Tensor geo_base;   // geo: the parameters as of the last exchange, flat
  Tensor geo_delta;  // geo: current - base, flat
  // Pings the servers while the training loop does not call them (evaluation, checkpoints),
  // so their watchdog only fires for trainers that are really gone.
  std::thread heartbeat;
  std::mutex heartbeat_mu;
  std::condition_variable heartbeat_cv;
  bool heartbeat_stop = false;

  void start_heartbeat() {
    const auto interval = std::clamp<Millis>(options.timeout / 4, Millis(1000), Millis(30000));
    heartbeat = std::thread([this, interval] {
      std::unique_lock<std::mutex> lock(heartbeat_mu);
      while (!heartbeat_cv.wait_for(lock, interval, [this] { return heartbeat_stop; })) {
        lock.unlock();
        client->ping();
        lock.lock();
      }
    });
  }
  void stop_heartbeat() {
    {
      std::lock_guard<std::mutex> lock(heartbeat_mu);
      heartbeat_stop = true;
    }
    heartbeat_cv.notify_all();
    if (heartbeat.joinable()) heartbeat.join();
  }

  Impl(nn::Module& m, optim::Optimizer& o, TrainerOptions opts)
      : model(m), optimizer(o), options(std::move(opts)) {}

  void say(const std::string& line) const {
    if (options.log) {
      options.log(line);
    } else {
      std::cerr << line << std::endl;
    }
  }

  detail::FlatView gradient_view(std::vector<Tensor>& keep) const {
    keep.clear();
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor g = params[i].grad();
      DPAR_CHECK(g.defined(), "ps: parameter '", names[i], "' has no gradient at step ", steps,
                 " (not used in forward? every parameter must get a gradient in ps mode)");
      keep.push_back(g.is_contiguous() ? g : g.contiguous());
    }
    return detail::FlatView(keep);
  }

  void snapshot_geo_base() { param_view.gather(0, layout.total(), geo_base.data<float>()); }

  void exchange_geo() {
    const int64_t n = layout.total();
    float* delta = geo_delta.data<float>();
    param_view.gather(0, n, delta);
    const float* base = geo_base.data<float>();
    for (int64_t i = 0; i < n; ++i) delta[i] -= base[i];
    detail::rpc::PushHeader header;
    header.set_step(steps);
    header.set_lr(optimizer.lr());
    header.set_weight(1);
    const auto t0 = Clock::now();
    client->push(header, detail::FlatView({geo_delta}));
    stats.push_seconds += seconds_since(t0);
    const auto t1 = Clock::now();
    client->pull(0, steps, param_view);
    stats.pull_seconds += seconds_since(t1);
    snapshot_geo_base();
  }
};

ParameterServerTrainer::ParameterServerTrainer(nn::Module& model, optim::Optimizer& optimizer,
                                               const PsEnv& env, TrainerOptions options)
    : impl_(std::make_unique<Impl>(model, optimizer, std::move(options))) {
  Impl& m = *impl_;
  DPAR_CHECK(env.role == Role::kTrainer, "ps: ParameterServerTrainer needs TRAINING_ROLE=TRAINER");
  DPAR_CHECK(!env.server_endpoints.empty(), "ps: no parameter servers (DPAR_PSERVER_ENDPOINTS)");
  DPAR_CHECK(env.trainer_id >= 0 && env.trainer_id < env.num_trainers, "ps: trainer id ",
             env.trainer_id, " out of range 0..", env.num_trainers - 1);
  DPAR_CHECK(m.options.geo_k_steps >= 1, "ps: geo k steps must be >= 1, got ",
             m.options.geo_k_steps);
  m.trainer_id = env.trainer_id;
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (auto& [name, tensor] : model.named_parameters()) {
    m.names.push_back(name);
    m.params.push_back(tensor);
    sizes.emplace_back(name, tensor.numel());
  }
  const std::vector<Tensor>& opt_params = optimizer.params();
  bool same = opt_params.size() == m.params.size();
  for (size_t i = 0; same && i < m.params.size(); ++i) same = opt_params[i].is_same(m.params[i]);
  DPAR_CHECK(same, "ps: the optimizer must hold exactly the model's parameters, in order (",
             opt_params.size(), " vs ", m.params.size(), ")");
  m.layout =
      ShardLayout(sizes, static_cast<int>(env.server_endpoints.size()), m.options.block_size);
  m.param_view = detail::FlatView(m.params);

  detail::rpc::ModeConfig mode;
  mode.set_mode(mode_name(m.options.mode));
  mode.set_num_trainers(env.num_trainers);
  mode.set_max_staleness(m.options.max_staleness);
  mode.set_geo_k_steps(m.options.geo_k_steps);
  detail::ClientOptions copts{env.server_endpoints,      env.trainer_id,    env.job_token,
                              m.options.connect_timeout, m.options.timeout, m.options.log};
  m.client = std::make_unique<detail::PsClient>(copts, m.layout, mode);

  const bool resuming = !m.options.resume_dir.empty();
  m.steps = resuming ? m.options.resume_step : 0;
  m.client->connect(/*wait_for_init=*/env.trainer_id != 0);
  if (env.trainer_id == 0) {
    detail::rpc::InitHeader header;
    *header.mutable_layout() = detail::to_proto(m.layout);
    *header.mutable_mode() = mode;
    *header.mutable_optimizer() = server_optimizer(optimizer);
    header.set_resume_dir(m.options.resume_dir);
    header.set_resume_step(m.options.resume_step);
    m.client->init(header, m.param_view);
  }
  // Everyone, trainer 0 included, starts from the servers' values (after a resume they are
  // the checkpointed ones).
  {
    NoGradGuard no_grad;
    const int64_t version = m.client->pull(0, m.steps, m.param_view);
    if (m.options.mode == Mode::kSync && version != m.steps) {
      DPAR_FAIL("ps: the servers are at step ", version, ", trainer ", env.trainer_id, " at step ",
                m.steps, " (resume every trainer from the same checkpoint)");
    }
  }
  if (m.options.mode == Mode::kGeo) {
    m.geo_base = Tensor::empty({m.layout.total()});
    m.geo_delta = Tensor::empty({m.layout.total()});
    m.snapshot_geo_base();
  }
  m.say("ps trainer " + std::to_string(env.trainer_id) + ": " + mode_name(m.options.mode) +
        " mode, " + m.layout.describe());
  m.start_heartbeat();
}

ParameterServerTrainer::~ParameterServerTrainer() {
  Impl& m = *impl_;
  m.stop_heartbeat();
  if (m.finished) return;
  m.finished = true;
  try {
    // Going down with an exception (a failed step, a NaN loss, a dead server): tell the
    // servers to fail the job rather than count this trainer as done, and hand in nothing.
    m.client->finish(/*aborted=*/std::uncaught_exceptions() > 0);
  } catch (const std::exception& e) {
    m.say(std::string("ps trainer: could not tell the servers it stopped: ") + e.what());
  }
}

void ParameterServerTrainer::step(int64_t samples) {
  Impl& m = *impl_;
  DPAR_CHECK(!m.finished, "ps: step() after finish()");
  NoGradGuard no_grad;
  if (m.options.mode == Mode::kGeo) {
    m.optimizer.step();
    ++m.steps;
    if (m.steps % m.options.geo_k_steps == 0) m.exchange_geo();
    return;
  }
  std::vector<Tensor> grads;
  const detail::FlatView grad_view = m.gradient_view(grads);
  detail::rpc::PushHeader header;
  header.set_step(m.steps);
  header.set_lr(m.optimizer.lr());
  header.set_weight(static_cast<double>(samples));
  const auto t0 = Clock::now();
  m.client->push(header, grad_view);
  m.stats.push_seconds += seconds_since(t0);
  ++m.steps;
  const auto t1 = Clock::now();
  // sync: wait for the version this step produces; async: the latest (bounded staleness is
  // the server's business, given this trainer's step count).
  m.client->pull(m.options.mode == Mode::kSync ? m.steps : 0, m.steps, m.param_view);
  m.stats.pull_seconds += seconds_since(t1);
}

std::vector<std::string> ParameterServerTrainer::save(const std::string& dir, int keep) {
  return impl_->client->save(dir, impl_->steps, keep);
}

void ParameterServerTrainer::finish() {
  Impl& m = *impl_;
  if (m.finished) return;
  m.finished = true;
  m.stop_heartbeat();
  // GEO: hand in the local progress since the last exchange, so no trainer's work is lost.
  if (m.options.mode == Mode::kGeo && m.steps % m.options.geo_k_steps != 0) m.exchange_geo();
  m.client->finish();
}

int64_t ParameterServerTrainer::steps() const { return impl_->steps; }
const ShardLayout& ParameterServerTrainer::layout() const { return impl_->layout; }
int ParameterServerTrainer::trainer_id() const { return impl_->trainer_id; }

const TrainerStats& ParameterServerTrainer::stats() const {
  impl_->stats.bytes_pushed = impl_->client->bytes_pushed();
  impl_->stats.bytes_pulled = impl_->client->bytes_pulled();
  return impl_->stats;
}

}  // namespace dpar::ps
