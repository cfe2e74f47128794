#include "train_optim.h"

#include "dpar/core/flags.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/rmsprop.h"
#include "dpar/optim/sgd.h"

namespace mobilenetv3 {

using namespace dpar;

namespace {

template <class Opt, class OptOptions>
std::shared_ptr<optim::Optimizer> build(dist::DataParallel* dp, const std::vector<Tensor>& params,
                                        const OptOptions& options) {
  if (dp != nullptr) return dp->make_optimizer<Opt>(options);
  return std::make_shared<Opt>(params, options);
}

}  // namespace

std::shared_ptr<optim::Optimizer> make_optimizer(const OptimizerChoice& c, dist::DataParallel* dp,
                                                 const std::vector<Tensor>& params) {
  if (c.name == "sgd" || c.name == "momentum") {
    return build<optim::SGD>(
        dp, params,
        optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  }
  if (c.name == "rmsprop") {
    return build<optim::RMSprop>(
        dp, params,
        optim::RMSpropOptions{.lr = c.lr, .weight_decay = c.weight_decay, .momentum = c.momentum});
  }
  if (c.name == "adamw") {
    return build<optim::AdamW>(dp, params,
                               optim::AdamWOptions{.lr = c.lr, .weight_decay = c.weight_decay});
  }
  throw FlagError("train: --opt=" + c.name + ": expected sgd, rmsprop or adamw");
}

std::unique_ptr<optim::LRScheduler> make_scheduler(const ScheduleChoice& c,
                                                   optim::Optimizer& optimizer,
                                                   int64_t steps_per_epoch) {
  if (c.name == "cosine") {
    return std::make_unique<optim::CosineWarmupLR>(
        optimizer, c.epochs * steps_per_epoch,
        static_cast<int64_t>(c.warmup_epochs * static_cast<double>(steps_per_epoch)));
  }
  if (c.name == "step") {
    return std::make_unique<optim::StepLR>(optimizer, c.step_epochs * steps_per_epoch, c.gamma);
  }
  throw FlagError("train: --lr-scheduler=" + c.name + ": expected cosine or step");
}

}  // namespace mobilenetv3
