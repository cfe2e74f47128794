#pragma once
// Stochastic gradient descent with momentum, dampening, (L2) weight decay and Nesterov, as
// torch.optim.SGD:
//   g = grad + weight_decay * p
//   b = g on the first step, else momentum * b + (1 - dampening) * g
//   p -= lr * (nesterov ? g + momentum * b : b)
#include "dpar/optim/optimizer.h"

namespace dpar::optim {

struct SGDOptions {
  double lr = -1;  // required, as in torch: leaving it unset is an error
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  const char* name() const override { return "SGD"; }
  const SGDOptions& options() const { return options_; }

 protected:
  void update() override;
  std::vector<std::string> buffer_names() const override;
  bool counts_steps() const override { return false; }

 private:
  SGDOptions options_;
};

}  // namespace dpar::optim
