// RMSprop: option checks and the fused update (per parameter, or all of a device at once).
#include "dpar/optim/rmsprop.h"

#include <cmath>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "optim/optim_kernels.h"

namespace dpar::optim {

RMSprop::RMSprop(std::vector<Tensor> params, const RMSpropOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  check_lr(options.lr);
  DPAR_CHECK(std::isfinite(options.alpha) && options.alpha >= 0,
             "RMSprop: alpha must be >= 0, got ", options.alpha);
  DPAR_CHECK(std::isfinite(options.eps) && options.eps >= 0, "RMSprop: eps must be >= 0, got ",
             options.eps);
  DPAR_CHECK(std::isfinite(options.momentum) && options.momentum >= 0,
             "RMSprop: momentum must be >= 0, got ", options.momentum);
  DPAR_CHECK(std::isfinite(options.weight_decay) && options.weight_decay >= 0,
             "RMSprop: weight_decay must be >= 0, got ", options.weight_decay);
  lr_ = options.lr;
}

std::vector<std::string> RMSprop::buffer_names() const {
  std::vector<std::string> names{"square_avg"};
  if (options_.momentum > 0) names.push_back("momentum_buffer");
  if (options_.centered) names.push_back("grad_avg");
  return names;
}

void RMSprop::update() {
  DPAR_PROFILE_SCOPE("optimizer_step");
  NoGradGuard no_grad;
  kernels::RmspropStepArgs args;
  args.lr = static_cast<float>(lr_);
  args.alpha = static_cast<float>(options_.alpha);
  args.one_minus_alpha = static_cast<float>(1.0 - options_.alpha);
  args.eps = static_cast<float>(options_.eps);
  args.weight_decay = static_cast<float>(options_.weight_decay);
  args.momentum = static_cast<float>(options_.momentum);
  for (const auto& [device, indices] : params_by_device()) {
    const bool multi = multi_tensor_ && kernels::rmsprop_step_multi.available(device);
    std::vector<Operands> all;
    std::vector<kernels::RmspropStepItem> items;
    for (size_t i : indices) {
      Operands ops;
      if (!prepare(i, ops, /*zero_init=*/true)) continue;
      auto& bufs = ops.state->buffers;
      Tensor grad_avg = options_.centered ? bufs.at("grad_avg") : Tensor();
      Tensor momentum = options_.momentum > 0 ? bufs.at("momentum_buffer") : Tensor();
      if (multi) {
        items.push_back({ops.param, ops.grad, bufs.at("square_avg"), grad_avg, momentum});
        all.push_back(std::move(ops));
        continue;
      }
      kernels::rmsprop_step.get(device)(ops.param, ops.grad, bufs.at("square_avg"), grad_avg,
                                        momentum, args);
      finish(ops);
    }
    // Every parameter of the device in one call (no per-parameter scalars: RMSprop's step
    // count is not part of the update).
    if (!items.empty()) kernels::rmsprop_step_multi.get(device)(items, args);
    for (const Operands& ops : all) finish(ops);
  }
}

}  // namespace dpar::optim
