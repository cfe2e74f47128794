#pragma once
// Learning-rate schedulers. A scheduler owns a step counter and sets the optimizer's lr to the
// schedule's value at that step: at construction (step 0) and after every step(). Whether a
// step is an iteration or an epoch is the caller's choice.
#include <cstdint>
#include <vector>

#include "dpar/optim/optimizer.h"

namespace dpar::optim {

class LRScheduler {
 public:
  // base_lr is the optimizer's lr at construction.
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step and applies the new lr to the optimizer.
  void step();
  double get_lr() const { return lr_at(last_step_); }  // the lr for the current step
  int64_t last_step() const { return last_step_; }
  double base_lr() const { return base_lr_; }
  // The schedule's value at any step (pure; does not change the scheduler).
  virtual double lr_at(int64_t step) const = 0;

  // Save/restore (checkpoints): {"last_step": i64 scalar}. Loading jumps to that step and
  // applies its lr to the optimizer.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);
  void set_last_step(int64_t step);

 protected:
  // Subclasses call this at the end of their constructor, once lr_at() is usable.
  void apply();

  Optimizer& optimizer_;
  double base_lr_;
  int64_t last_step_ = 0;
};

// lr = base_lr * gamma^(step / step_size), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// PaddlePaddle's PiecewiseDecay: values[i] for the first boundary with step < boundaries[i],
// values.back() past the last one. boundaries strictly increasing, values.size() ==
// boundaries.size() + 1. The values are absolute learning rates (base_lr is not used).
class PiecewiseLR : public LRScheduler {
 public:
  PiecewiseLR(Optimizer& optimizer, std::vector<int64_t> boundaries, std::vector<double> values);
  double lr_at(int64_t step) const override;

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
};

// PaddlePaddle's LinearWarmup(CosineAnnealingDecay): steps [0, warmup_steps) rise linearly
// from warmup_start_lr towards base_lr; then a half cosine from base_lr at step warmup_steps
// down to min_lr at step total_steps, and min_lr after that.
class CosineWarmupLR : public LRScheduler {
 public:
  CosineWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps = 0,
                 double warmup_start_lr = 0, double min_lr = 0);
  double lr_at(int64_t step) const override;

 private:
  int64_t total_steps_;
  int64_t warmup_steps_;
  double warmup_start_lr_;
  double min_lr_;
};

}  // namespace dpar::optim
