// SGD: option checks and the fused update (per parameter, or all of a device at once).
#include "dpar/optim/sgd.h"

#include <cmath>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "optim/optim_kernels.h"

namespace dpar::optim {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  check_lr(options.lr);
  DPAR_CHECK(std::isfinite(options.momentum) && options.momentum >= 0,
             "SGD: momentum must be >= 0, got ", options.momentum);
  DPAR_CHECK(std::isfinite(options.weight_decay) && options.weight_decay >= 0,
             "SGD: weight_decay must be >= 0, got ", options.weight_decay);
  DPAR_CHECK(std::isfinite(options.dampening), "SGD: dampening must be finite, got ",
             options.dampening);
  DPAR_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
             "SGD: nesterov requires momentum > 0 and dampening == 0, got momentum ",
             options.momentum, ", dampening ", options.dampening);
  lr_ = options.lr;
}

std::vector<std::string> SGD::buffer_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update() {
  DPAR_PROFILE_SCOPE("optimizer_step");
  NoGradGuard no_grad;
  kernels::SgdStepArgs args;
  args.lr = static_cast<float>(lr_);
  args.momentum = static_cast<float>(options_.momentum);
  args.one_minus_dampening = static_cast<float>(1.0 - options_.dampening);
  args.weight_decay = static_cast<float>(options_.weight_decay);
  args.nesterov = options_.nesterov;
  for (const auto& [device, indices] : params_by_device()) {
    const bool multi = multi_tensor_ && kernels::sgd_step_multi.available(device);
    std::vector<Operands> all;
    std::vector<kernels::SgdStepItem> items;
    for (size_t i : indices) {
      Operands ops;
      if (!prepare(i, ops, /*zero_init=*/false)) continue;
      Tensor buf;
      if (options_.momentum != 0) buf = ops.state->buffers.at("momentum_buffer");
      args.first_step = !ops.state->initialized;
      if (multi) {
        items.push_back({ops.param, ops.grad, buf, args.first_step});
        all.push_back(std::move(ops));
        continue;
      }
      kernels::sgd_step.get(device)(ops.param, ops.grad, buf, args);
      finish(ops);
    }
    // Every parameter of the device in one call; first_step is per item because a parameter
    // whose gradient appears later starts its momentum buffer later.
    if (!items.empty()) kernels::sgd_step_multi.get(device)(items, args);
    for (const Operands& ops : all) finish(ops);
  }
}

}  // namespace dpar::optim
