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
  void step() override;
  const char* name() const override { return "AdamW"; }
  const AdamWOptions& options() const { return options_; }

 protected:
  std::vector<std::string> buffer_names() const override;
  bool counts_steps() const override { return true; }

 private:
  AdamWOptions options_;
};

}  // namespace dpar::optim
