#pragma once
// Dynamic loss scaling for mixed-precision training, as torch.amp.GradScaler.
//
// Half-precision gradients underflow to zero when they are small; multiplying the loss by a
// large scale S before backward shifts every gradient up by S, and dividing by S before the
// optimizer runs restores them. When S is too large some gradient overflows to inf (or a nan
// appears): that step is skipped and S is reduced; after growth_interval finite steps in a row
// S is increased again. A training step reads
//
//   scaler.scale(loss).backward();
//   scaler.unscale(optimizer);     // optional: only to look at true gradients (clipping)
//   scaler.step(optimizer);        // unscales if not done; skips the step on inf/nan
//   scaler.update();               // adjusts S for the next step
//
// The scaler works on the f32 gradients of the optimizer's parameters on any device: each
// gradient is unscaled and checked in one pass (kernel slot unscale_and_check_finite), the
// per-device found-inf flags stay on the device and are read once per step, in step(). With
// DataParallel the gradients are already averaged over the ranks, so every rank sees the same
// flags and skips the same steps; with a sharded DataParallel each rank sees its slice of them,
// and the flags are summed over the ranks (the optimizer's cross_shard_sum) once per step. Powers
// of two as scale, growth and backoff keep scaling exact: a scaled-and-unscaled gradient equals the
// unscaled one bitwise (barring overflow and subnormals).
//
// As in PyTorch the scale is an f32 value, and a disabled scaler passes everything through
// (scale() returns the loss, step() just steps, get_scale() is 1).
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "dpar/optim/optimizer.h"
#include "dpar/tensor/tensor.h"

namespace dpar::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;     // 2^16; a positive value finite in f32
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // >= 1 consecutive finite steps before growing
  bool enabled = true;
};

class GradScaler {
 public:
  // Throws one dpar::Error naming the first invalid option and its value.
  explicit GradScaler(const GradScalerOptions& options = {});

  // loss * scale (differentiable: its gradient carries the scale into backward).
  Tensor scale(const Tensor& loss) const;

  // Divides every defined gradient of the optimizer's parameters by the scale, in place, and
  // records (on their devices) whether any result is inf or nan. At most once per optimizer
  // between update() calls, and not after step(): both are errors, as in PyTorch.
  void unscale(optim::Optimizer& optimizer);

  // Unscales if unscale() was not called, then runs optimizer.step() unless a gradient was
  // inf or nan. Returns whether the optimizer stepped. Once per optimizer between update()
  // calls; at least one parameter must have a gradient.
  bool step(optim::Optimizer& optimizer);

  // Ends the iteration: a non-finite gradient seen by any optimizer multiplies the scale by
  // backoff_factor and restarts the count of finite steps; otherwise the count grows, and at
  // growth_interval the scale is multiplied by growth_factor (unless that overflows f32) and
  // the count restarts. Requires a step() or unscale() since the last update().
  void update();

  // The current scale (1 when disabled), the finite steps since it last changed, and the steps
  // skipped since construction (for the training log).
  double get_scale() const;
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // {"scale": f32 scalar, "growth_tracker": i64 scalar}; empty when disabled. The options are
  // the constructor's and are not part of the state.
  optim::StateDict state_dict() const;
  // Checks everything before changing anything; an empty state (saved by a disabled scaler) or
  // a wrong entry is an error. A disabled scaler ignores the state, as in PyTorch.
  void load_state_dict(const optim::StateDict& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  // What the scaler knows about one optimizer since the last update().
  struct OptimizerState {
    Stage stage = Stage::ready;
    std::vector<Tensor> found_inf;  // one f32 flag per device of its gradients
    std::optional<bool> any_inf;    // the flags, once read
    // The optimizer's cross_shard_sum: a sharded optimizer's flags are combined over ranks.
    optim::Optimizer::CrossShardSum cross_shard_sum;
  };
  bool found_inf(OptimizerState& state);

  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
  // Keyed by address (PyTorch keys by id(optimizer)) and cleared by every update().
  std::map<const optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace dpar::amp
