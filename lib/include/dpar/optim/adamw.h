#pragma once
// AdamW (decoupled weight decay) as torch.optim.AdamW without amsgrad:
//   p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#include "dpar/optim/optimizer.h"

namespace dpar::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  const char* name() const override { return "AdamW"; }
  const AdamWOptions& options() const { return options_; }

 protected:
  void update() override;
  std::vector<std::string> buffer_names() const override;
  bool counts_steps() const override { return true; }
  // Adam's L2 form: weight_decay * p is added to the gradient instead of decaying p.
  void use_l2_weight_decay() { l2_weight_decay_ = true; }

 private:
  AdamWOptions options_;
  bool l2_weight_decay_ = false;
};

// Adam as torch.optim.Adam (without amsgrad): the AdamW update with the weight decay, if any,
// applied as L2 regularisation (g += weight_decay * p) rather than decoupled; with
// weight_decay 0 (the default, as in torch) both are the same update. State dict keys
// (exp_avg, exp_avg_sq, step) are torch's.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class Adam : public AdamW {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  const char* name() const override { return "Adam"; }
};

}  // namespace dpar::optim
