#pragma once
// RMSprop as torch.optim.RMSprop (eps added outside the square root):
//   g = grad + weight_decay * p
//   v = alpha * v + (1 - alpha) * g^2
//   centered: a = alpha * a + (1 - alpha) * g;  d = sqrt(v - a^2) + eps,  else d = sqrt(v) + eps
//   momentum > 0: b = momentum * b + g / d;  p -= lr * b      else p -= lr * g / d
#include "dpar/optim/optimizer.h"

namespace dpar::optim {

struct RMSpropOptions {
  double lr = 0.01;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
};

class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, const RMSpropOptions& options = {});
  const char* name() const override { return "RMSprop"; }
  const RMSpropOptions& options() const { return options_; }

 protected:
  void update() override;
  std::vector<std::string> buffer_names() const override;
  bool counts_steps() const override { return true; }

 private:
  RMSpropOptions options_;
};

}  // namespace dpar::optim
