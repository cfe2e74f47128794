#pragma once
// Parameter-server mode of the training program (--dist-mode=ps, or TRAINING_ROLE from
// dpar-launch --run_mode=ps). The same binary is both roles: a PSERVER process serves its
// shard until every trainer is done; a TRAINER trains as in collective mode but replaces the
// local optimizer step with a push of its gradients and a pull of fresh parameters.
#include <cstdint>
#include <memory>
#include <string>

#include "dpar/ps/ps.h"

namespace dpar {
class Flags;
}

namespace mobilenetv3 {

struct PsSettings {
  std::string dist_mode;  // auto, collective or ps
  std::string mode;       // sync, async or geo
  int64_t geo_k_steps = 10;
  int64_t max_staleness = -1;
  double connect_timeout_s = 120;
  double timeout_s = 300;
  int64_t block_size = dpar::ps::kDefaultBlockSize;
};

// Registers --dist-mode, --ps-mode, --geo-k-steps, --max-staleness, --ps-connect-timeout,
// --ps-timeout and --ps-block-size; settings() reads them once the flags are parsed.
class PsFlags {
 public:
  explicit PsFlags(dpar::Flags& flags);
  PsSettings settings() const;

 private:
  std::string& dist_mode_;
  std::string& mode_;
  int64_t& geo_k_steps_;
  int64_t& max_staleness_;
  double& connect_timeout_s_;
  double& timeout_s_;
  int64_t& block_size_;
};
// Whether this process runs in ps mode; throws FlagError for a bad combination (e.g.
// --dist-mode=ps outside a ps job, or a bad --ps-mode).
bool use_ps(const PsSettings& settings, const dpar::ps::PsEnv& env);
// The PSERVER role: serve until every trainer finished. Returns the exit status.
int serve_parameters(const dpar::ps::PsEnv& env, const PsSettings& settings);
// The TRAINER role's link to the servers. resume_dir/resume_step: the servers restore the
// shards they saved there at that step.
std::unique_ptr<dpar::ps::ParameterServerTrainer> connect_trainer(
    dpar::nn::Module& model, dpar::optim::Optimizer& optimizer, const dpar::ps::PsEnv& env,
    const PsSettings& settings, const std::string& resume_dir, int64_t resume_step);

}  // namespace mobilenetv3
