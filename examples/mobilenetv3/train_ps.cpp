#include "train_ps.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "dpar/core/flags.h"

namespace mobilenetv3 {
namespace {

using dpar::FlagError;
namespace ps = dpar::ps;

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// Lines from the ps library, flushed in order with the program's own output.
void print_line(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

PsFlags::PsFlags(dpar::Flags& flags)
    : dist_mode_(flags.add_string("dist-mode", "auto",
                                  "collective or ps (auto: ps when TRAINING_ROLE is set, as "
                                  "dpar-launch --run_mode=ps does)")),
      mode_(flags.add_string("ps-mode", "sync", "parameter-server mode: sync, async or geo")),
      geo_k_steps_(
          flags.add_int("geo-k-steps", 10, "geo: exchange parameter deltas every k steps")),
      max_staleness_(flags.add_int("max-staleness", -1,
                                   "async: how many pushes other trainers may lag (-1: no bound)")),
      connect_timeout_s_(flags.add_double("ps-connect-timeout", 120,
                                          "seconds a trainer waits for the servers to come up")),
      timeout_s_(flags.add_double("ps-timeout", 300,
                                  "seconds a sync step (or a silent job) may stall before the "
                                  "servers and trainers fail naming the missing trainers")),
      block_size_(flags.add_int("ps-block-size", ps::kDefaultBlockSize,
                                "minimum block of parameters spread over the servers (elements)")) {
}

PsSettings PsFlags::settings() const {
  return {dist_mode_,         mode_,      geo_k_steps_, max_staleness_,
          connect_timeout_s_, timeout_s_, block_size_};
}

bool use_ps(const PsSettings& s, const ps::PsEnv& env) {
  if (s.dist_mode != "auto" && s.dist_mode != "collective" && s.dist_mode != "ps") {
    throw FlagError("train: --dist-mode=" + s.dist_mode + ": expected auto, collective or ps");
  }
  const bool in_ps_job = env.role != ps::Role::kNone;
  if (s.dist_mode == "ps" && !in_ps_job) {
    throw FlagError(
        "train: --dist-mode=ps needs a parameter-server job: start it with "
        "dpar-launch --run_mode=ps (TRAINING_ROLE is not set)");
  }
  if (s.dist_mode == "collective" && in_ps_job) {
    throw FlagError("train: --dist-mode=collective, but this process was started as a ps " +
                    std::string(env.role == ps::Role::kServer ? "PSERVER" : "TRAINER") +
                    " (TRAINING_ROLE)");
  }
  const bool ps_mode = s.dist_mode == "ps" || (s.dist_mode == "auto" && in_ps_job);
  if (!ps_mode) return false;
  if (s.mode != "sync" && s.mode != "async" && s.mode != "geo") {
    throw FlagError("train: --ps-mode=" + s.mode + ": expected sync, async or geo");
  }
  if (s.geo_k_steps < 1) throw FlagError("train: --geo-k-steps must be >= 1");
  if (!(s.connect_timeout_s > 0)) throw FlagError("train: --ps-connect-timeout must be > 0");
  if (!(s.timeout_s > 0)) throw FlagError("train: --ps-timeout must be > 0");
  if (s.block_size < 1) throw FlagError("train: --ps-block-size must be >= 1");
  return true;
}

int serve_parameters(const ps::PsEnv& env, const PsSettings& s) {
  ps::Server server({.endpoint = env.endpoint(),
                     .server_id = env.server_id,
                     .num_servers = static_cast<int>(env.server_endpoints.size()),
                     .num_trainers = env.num_trainers,
                     .job_token = env.job_token,
                     .timeout = millis(s.timeout_s),
                     .log = print_line});
  std::printf("ps server %d of %zu listening on %s for %d trainer(s) (job %s, pid %d)\n",
              env.server_id, env.server_endpoints.size(), server.endpoint().c_str(),
              env.num_trainers, env.job_id.c_str(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  server.run();
  std::printf("ps server %d: every trainer finished; exiting\n", env.server_id);
  return 0;
}

std::unique_ptr<ps::ParameterServerTrainer> connect_trainer(
    dpar::nn::Module& model, dpar::optim::Optimizer& optimizer, const ps::PsEnv& env,
    const PsSettings& s, const std::string& resume_dir, int64_t resume_step) {
  ps::TrainerOptions options;
  options.mode = ps::parse_mode(s.mode);
  options.geo_k_steps = s.geo_k_steps;
  options.max_staleness = s.max_staleness;
  options.block_size = s.block_size;
  options.connect_timeout = millis(s.connect_timeout_s);
  options.timeout = millis(s.timeout_s);
  options.resume_dir = resume_dir;
  options.resume_step = resume_step;
  options.log = print_line;
  return std::make_unique<ps::ParameterServerTrainer>(model, optimizer, env, options);
}

}  // namespace mobilenetv3
