#pragma once
// Activation modules with torch.nn's names and reprs (they hold no parameters).
#include <sstream>
#include <string>

#include "dpar/nn/module.h"
#include "dpar/tensor/ops.h"

namespace dpar::nn {

class GELU : public Module {
 public:
  explicit GELU(GeluApproximation approximate = GeluApproximation::none)
      : Module("GELU"), approximate(approximate) {}
  Tensor forward(const Tensor& input) override { return gelu(input, approximate); }
  const GeluApproximation approximate;

 protected:
  std::string extra_repr() const override {
    return approximate == GeluApproximation::tanh ? "approximate='tanh'" : "approximate='none'";
  }
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override { return dpar::tanh(input); }
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override { return sigmoid(input); }
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& input) override { return silu(input); }
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01)
      : Module("LeakyReLU"), negative_slope(negative_slope) {}
  Tensor forward(const Tensor& input) override { return leaky_relu(input, negative_slope); }
  const double negative_slope;

 protected:
  std::string extra_repr() const override {
    std::ostringstream os;
    os << "negative_slope=" << negative_slope;
    return os.str();
  }
};

class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0)
      : Module("Softplus"), beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& input) override { return softplus(input, beta, threshold); }
  const double beta, threshold;

 protected:
  std::string extra_repr() const override {
    std::ostringstream os;
    os << "beta=" << beta << ", threshold=" << threshold;
    return os.str();
  }
};

}  // namespace dpar::nn
