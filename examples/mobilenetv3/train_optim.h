#pragma once
// The trainer's optimizer and learning-rate schedule, as its flags choose them (--opt, --lr,
// --momentum, --weight-decay; --lr-scheduler, --warmup-epochs, --lr-step-epochs, --lr-gamma).
// Shared by the fixed-world trainer (train.cpp) and the elastic one (train_elastic.cpp).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/data_parallel.h"
#include "dpar/optim/lr_scheduler.h"
#include "dpar/optim/optimizer.h"

namespace mobilenetv3 {

struct OptimizerChoice {
  std::string name;  // sgd (or momentum), rmsprop, adamw
  double lr = 0.1, momentum = 0.9, weight_decay = 0;
};

// Through DataParallel when dp is given, so that with --shard it updates this rank's slices
// (and gathers them after each step); otherwise over `params` directly (an elastic member's
// optimizer outlives each round's DataParallel). Throws FlagError for an unknown name.
std::shared_ptr<dpar::optim::Optimizer> make_optimizer(const OptimizerChoice& choice,
                                                       dpar::dist::DataParallel* dp,
                                                       const std::vector<dpar::Tensor>& params);

struct ScheduleChoice {
  std::string name;  // cosine (with linear warm-up) or step
  int64_t epochs = 1;
  double warmup_epochs = 0;  // cosine
  int64_t step_epochs = 1;   // step: epochs per decay
  double gamma = 0.1;        // step: decay factor
};

// The schedule over epochs x steps_per_epoch steps. Throws FlagError for an unknown name.
std::unique_ptr<dpar::optim::LRScheduler> make_scheduler(const ScheduleChoice& choice,
                                                         dpar::optim::Optimizer& optimizer,
                                                         int64_t steps_per_epoch);

}  // namespace mobilenetv3
