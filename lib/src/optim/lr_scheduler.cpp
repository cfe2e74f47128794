// Learning-rate schedules (closed forms, so any step can be computed directly and a restored
// scheduler continues exactly where the saved one was).
#include "dpar/optim/lr_scheduler.h"

#include <cmath>
#include <numbers>

namespace dpar::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), base_lr_(optimizer.lr()) {}

void LRScheduler::apply() { optimizer_.set_lr(lr_at(last_step_)); }

void LRScheduler::step() {
  ++last_step_;
  apply();
}

void LRScheduler::set_last_step(int64_t step) {
  DPAR_CHECK(step >= 0, "LRScheduler::set_last_step: step must be >= 0, got ", step);
  last_step_ = step;
  apply();
}

StateDict LRScheduler::state_dict() const {
  return {{"last_step", Tensor::from_vector(std::vector<int64_t>{last_step_}, {})}};
}

void LRScheduler::load_state_dict(const StateDict& state) {
  const Tensor* found = nullptr;
  for (const auto& [key, t] : state) {
    DPAR_CHECK(key == "last_step", "LRScheduler::load_state_dict: unexpected entry '", key,
               "', expected only 'last_step'");
    found = &t;
  }
  DPAR_CHECK(found && found->defined() && found->numel() == 1,
             "LRScheduler::load_state_dict: missing a one-element 'last_step' entry");
  const double v = found->item();
  DPAR_CHECK(v >= 0 && v == std::floor(v), "LRScheduler::load_state_dict: 'last_step' is ", v,
             ", expected a step count");
  set_last_step(static_cast<int64_t>(v));
}

// ---- StepLR ---------------------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  DPAR_CHECK(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
  DPAR_CHECK(std::isfinite(gamma) && gamma >= 0, "StepLR: gamma must be >= 0, got ", gamma);
  apply();
}

double StepLR::lr_at(int64_t step) const {
  return base_lr_ * std::pow(gamma_, static_cast<double>(step / step_size_));
}

// ---- PiecewiseLR ----------------------------------------------------------------------------

PiecewiseLR::PiecewiseLR(Optimizer& optimizer, std::vector<int64_t> boundaries,
                         std::vector<double> values)
    : LRScheduler(optimizer), boundaries_(std::move(boundaries)), values_(std::move(values)) {
  DPAR_CHECK(values_.size() == boundaries_.size() + 1, "PiecewiseLR: expected ",
             boundaries_.size() + 1, " values for ", boundaries_.size(), " boundaries, got ",
             values_.size());
  for (size_t i = 1; i < boundaries_.size(); ++i) {
    DPAR_CHECK(boundaries_[i] > boundaries_[i - 1],
               "PiecewiseLR: boundaries must be strictly increasing, got ", boundaries_);
  }
  for (double v : values_) {
    DPAR_CHECK(std::isfinite(v) && v >= 0, "PiecewiseLR: values must be >= 0, got ", v);
  }
  apply();
}

double PiecewiseLR::lr_at(int64_t step) const {
  for (size_t i = 0; i < boundaries_.size(); ++i) {
    if (step < boundaries_[i]) return values_[i];
  }
  return values_.back();
}

// ---- CosineWarmupLR -------------------------------------------------------------------------

CosineWarmupLR::CosineWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps,
                               double warmup_start_lr, double min_lr)
    : LRScheduler(optimizer),
      total_steps_(total_steps),
      warmup_steps_(warmup_steps),
      warmup_start_lr_(warmup_start_lr),
      min_lr_(min_lr) {
  DPAR_CHECK(total_steps > 0, "CosineWarmupLR: total_steps must be > 0, got ", total_steps);
  DPAR_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
             "CosineWarmupLR: warmup_steps must be in [0, total_steps=", total_steps, "], got ",
             warmup_steps);
  DPAR_CHECK(std::isfinite(warmup_start_lr) && warmup_start_lr >= 0,
             "CosineWarmupLR: warmup_start_lr must be >= 0, got ", warmup_start_lr);
  DPAR_CHECK(std::isfinite(min_lr) && min_lr >= 0, "CosineWarmupLR: min_lr must be >= 0, got ",
             min_lr);
  apply();
}

double CosineWarmupLR::lr_at(int64_t step) const {
  if (step < warmup_steps_) {
    return warmup_start_lr_ + (base_lr_ - warmup_start_lr_) * static_cast<double>(step) /
                                  static_cast<double>(warmup_steps_);
  }
  const int64_t t = step - warmup_steps_;
  const int64_t period = total_steps_ - warmup_steps_;
  if (t >= period) return min_lr_;
  const double progress = static_cast<double>(t) / static_cast<double>(period);
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace dpar::optim
