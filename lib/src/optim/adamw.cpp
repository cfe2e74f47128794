// AdamW and Adam: option checks, bias corrections (in double, as torch computes them in Python) and
// the fused update (per parameter, or all of a device at once).
#include "dpar/optim/adamw.h"

#include <cmath>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "optim/optim_kernels.h"

namespace dpar::optim {

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  check_lr(options.lr);
  DPAR_CHECK(std::isfinite(options.eps) && options.eps >= 0, "AdamW: eps must be >= 0, got ",
             options.eps);
  DPAR_CHECK(options.beta1 >= 0 && options.beta1 < 1, "AdamW: beta1 must be in [0, 1), got ",
             options.beta1);
  DPAR_CHECK(options.beta2 >= 0 && options.beta2 < 1, "AdamW: beta2 must be in [0, 1), got ",
             options.beta2);
  DPAR_CHECK(std::isfinite(options.weight_decay) && options.weight_decay >= 0,
             "AdamW: weight_decay must be >= 0, got ", options.weight_decay);
  lr_ = options.lr;
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o)
    : AdamW(std::move(params), {.lr = o.lr,
                                .beta1 = o.beta1,
                                .beta2 = o.beta2,
                                .eps = o.eps,
                                .weight_decay = o.weight_decay}) {
  use_l2_weight_decay();
}

std::vector<std::string> AdamW::buffer_names() const { return {"exp_avg", "exp_avg_sq"}; }

void AdamW::update() {
  DPAR_PROFILE_SCOPE("optimizer_step");
  NoGradGuard no_grad;
  const AdamWOptions& o = options_;
  kernels::AdamwStepArgs args;
  args.decay = l2_weight_decay_ ? 1.f : static_cast<float>(1.0 - lr_ * o.weight_decay);
  args.beta1 = static_cast<float>(o.beta1);
  args.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  args.beta2 = static_cast<float>(o.beta2);
  args.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  args.eps = static_cast<float>(o.eps);
  for (const auto& [device, indices] : params_by_device()) {
    const bool multi = multi_tensor_ && kernels::adamw_step_multi.available(device);
    std::vector<Operands> all;
    std::vector<kernels::AdamwStepItem> items;
    for (size_t i : indices) {
      Operands ops;
      if (!prepare(i, ops, /*zero_init=*/true)) continue;
      if (l2_weight_decay_ && o.weight_decay != 0) {
        // torch's grad.add(param, alpha=weight_decay): a new tensor; p.grad is left alone.
        Tensor g = ops.grad.clone();
        add_(g, ops.param, o.weight_decay);
        ops.grad = g;
      }
      const double t = static_cast<double>(ops.state->step + 1);
      args.step_size = static_cast<float>(lr_ / (1.0 - std::pow(o.beta1, t)));
      args.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, t)));
      auto& bufs = ops.state->buffers;
      if (multi) {
        items.push_back({ops.param, ops.grad, bufs.at("exp_avg"), bufs.at("exp_avg_sq"),
                         args.step_size, args.bias_correction2_sqrt});
        all.push_back(std::move(ops));
        continue;
      }
      kernels::adamw_step.get(device)(ops.param, ops.grad, bufs.at("exp_avg"),
                                      bufs.at("exp_avg_sq"), args);
      finish(ops);
    }
    // Every parameter of the device in one call; the bias corrections are per item because
    // each parameter counts its own steps (one that had no gradient at first is behind).
    if (!items.empty()) kernels::adamw_step_multi.get(device)(items, args);
    for (const Operands& ops : all) finish(ops);
  }
}

}  // namespace dpar::optim
