// GradScaler: option checks, the per-optimizer unscale/step bookkeeping, and the scale update
// rule of PyTorch's _amp_update_scale_ (f32 scale, growth only when the result stays finite).
#include "dpar/optim/grad_scaler.h"

#include <cmath>
#include <string>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "optim/amp_kernels.h"

namespace dpar::amp {
namespace {

// The scale is kept in f32 like PyTorch's, so a value that is finite in double may not be.
bool positive_finite_f32(double v) {
  const float f = static_cast<float>(v);
  return std::isfinite(v) && std::isfinite(f) && f > 0;
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options) : options_(options) {
  // Checked even when disabled: a wrong option is a bug whether or not scaling is on.
  DPAR_CHECK(positive_finite_f32(options.init_scale),
             "GradScaler: init_scale must be > 0 and finite in f32, got ", options.init_scale);
  DPAR_CHECK(std::isfinite(options.growth_factor) && options.growth_factor > 1,
             "GradScaler: growth_factor must be finite and > 1, got ", options.growth_factor);
  DPAR_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1,
             "GradScaler: backoff_factor must be in (0, 1), got ", options.backoff_factor);
  DPAR_CHECK(options.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ",
             options.growth_interval);
  scale_ = static_cast<float>(options.init_scale);
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

Tensor GradScaler::scale(const Tensor& loss) const {
  DPAR_CHECK(loss.defined(), "GradScaler::scale: the loss is undefined");
  if (!options_.enabled) return loss;
  return mul(loss, static_cast<double>(scale_));
}

void GradScaler::unscale(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  DPAR_PROFILE_SCOPE("grad_scaler_unscale");
  OptimizerState& st = per_optimizer_[&optimizer];
  DPAR_CHECK(st.stage != Stage::unscaled, "GradScaler::unscale: already called for this ",
             optimizer.name(), " optimizer since the last update()");
  DPAR_CHECK(st.stage != Stage::stepped, "GradScaler::unscale: called after step() for this ",
             optimizer.name(), " optimizer; call update() first");
  NoGradGuard no_grad;
  // PyTorch's rounding: the reciprocal in double, then to f32 (exact for powers of two).
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  const auto& params = optimizer.params();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    Tensor* flag = nullptr;
    for (Tensor& f : st.found_inf) {
      if (f.device() == g.device()) flag = &f;
    }
    if (!flag) flag = &st.found_inf.emplace_back(Tensor::zeros({}, DType::f32, g.device()));
    const auto& kernel = kernels::unscale_and_check_finite.get(g.device());
    if (g.dtype() == DType::f32 && g.is_dense()) {
      kernel(g, inv_scale, *flag);  // g shares the gradient's storage: this is in place
    } else {
      // The kernel runs over flat f32 memory; other layouts or dtypes go through a copy.
      Tensor staged = Tensor::empty(g.shape(), DType::f32, g.device());
      staged.copy_(g);
      kernel(staged, inv_scale, *flag);
      g.copy_(staged);
    }
  }
  st.cross_shard_sum = optimizer.cross_shard_sum();
  st.stage = Stage::unscaled;
}

bool GradScaler::found_inf(OptimizerState& st) {
  if (!st.any_inf) {
    // The only host read of the flags: one synchronisation per device and step.
    bool any = false;
    for (const Tensor& f : st.found_inf) any = any || f.item() != 0;
    if (st.cross_shard_sum) {
      // Every rank must skip the same steps: one rank's inf is everyone's.
      Tensor count = Tensor::full({1}, any ? 1.0 : 0.0);
      st.cross_shard_sum(count);
      any = count.item() != 0;
    }
    st.any_inf = any;
  }
  return *st.any_inf;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  {
    const auto it = per_optimizer_.find(&optimizer);
    DPAR_CHECK(it == per_optimizer_.end() || it->second.stage != Stage::stepped,
               "GradScaler::step: already called for this ", optimizer.name(),
               " optimizer since the last update()");
    if (it == per_optimizer_.end() || it->second.stage == Stage::ready) unscale(optimizer);
  }
  OptimizerState& st = per_optimizer_.at(&optimizer);
  DPAR_CHECK(!st.found_inf.empty(), "GradScaler::step: no parameter of this ", optimizer.name(),
             " optimizer has a gradient; run backward on scaler.scale(loss) first");
  const bool skip = found_inf(st);
  if (skip) {
    ++skipped_steps_;
    optimizer.run_step_hooks();  // nothing changed, but the step is over
  } else {
    optimizer.step();
  }
  st.stage = Stage::stepped;
  return !skip;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool recorded = false, any_inf = false;
  for (auto& [optimizer, st] : per_optimizer_) {
    if (st.found_inf.empty()) continue;
    recorded = true;
    any_inf = found_inf(st) || any_inf;
  }
  DPAR_CHECK(recorded,
             "GradScaler::update: no inf/nan checks were recorded since the last update(); call "
             "step() (or unscale()) on an optimizer with gradients first");
  // PyTorch's _amp_update_scale_: products in double, stored as f32.
  if (any_inf) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    // >= rather than ==: a tracker restored from a run with a longer interval still grows.
    const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  per_optimizer_.clear();
}

optim::StateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", Tensor::from_vector(std::vector<float>{scale_}, {})},
          {"growth_tracker", Tensor::from_vector(std::vector<int64_t>{growth_tracker_}, {})}};
}

void GradScaler::load_state_dict(const optim::StateDict& state) {
  if (!options_.enabled) return;
  DPAR_CHECK(!state.empty(),
             "GradScaler::load_state_dict: the state is empty (saved by a disabled GradScaler?)");
  std::optional<double> scale, tracker;
  for (const auto& [key, t] : state) {
    std::optional<double>* slot = key == "scale"            ? &scale
                                  : key == "growth_tracker" ? &tracker
                                                            : nullptr;
    DPAR_CHECK(slot, "GradScaler::load_state_dict: unexpected entry '", key,
               "'; expected 'scale' and 'growth_tracker'");
    DPAR_CHECK(!slot->has_value(), "GradScaler::load_state_dict: entry '", key, "' appears twice");
    DPAR_CHECK(t.defined() && t.numel() == 1, "GradScaler::load_state_dict: entry '", key,
               "' must hold one value, got ", t.defined() ? t.str() : std::string("undefined"));
    *slot = t.item();
  }
  DPAR_CHECK(scale && tracker, "GradScaler::load_state_dict: missing entry '",
             scale ? "growth_tracker" : "scale", "'");
  DPAR_CHECK(positive_finite_f32(*scale),
             "GradScaler::load_state_dict: 'scale' must be > 0 and finite in f32, got ", *scale);
  DPAR_CHECK(*tracker >= 0 && *tracker < 1e18 && *tracker == std::floor(*tracker),
             "GradScaler::load_state_dict: 'growth_tracker' must be a count >= 0, got ", *tracker);
  scale_ = static_cast<float>(*scale);
  growth_tracker_ = static_cast<int64_t>(*tracker);
}

}  // namespace dpar::amp
