#pragma once
// Standard layers. Parameter and buffer names, shapes and default initialisation follow
// torch.nn, so state dicts are interchangeable with PyTorch.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dpar/core/random.h"
#include "dpar/nn/module.h"
#include "dpar/tensor/ops.h"

namespace dpar::nn {

// Runs its children in order; they are named "0", "1", ... as in torch.nn.Sequential.
class Sequential : public Module {
 public:
  Sequential();
  Sequential(std::initializer_list<ModulePtr> modules);
  explicit Sequential(const std::vector<ModulePtr>& modules);

  void push_back(ModulePtr module);
  size_t size() const { return modules_.size(); }
  const ModulePtr& operator[](size_t index) const;
  template <class M>
  std::shared_ptr<M> at(size_t index) const {
    auto typed = std::dynamic_pointer_cast<M>((*this)[index]);
    DPAR_CHECK(typed != nullptr, "Sequential::at: child ", index, " is a ",
               (*this)[index]->type_name(), ", not the requested type");
    return typed;
  }

  Tensor forward(const Tensor& input) override;
  // forward(input) + residual (the output's shape): where the children end in a Linear (then
  // only dropouts that are the identity: p = 0 or eval), the Linear adds the residual as it
  // writes (linear_add), as a transformer's x + mlp(x) wants.
  Tensor forward_add(const Tensor& input, const Tensor& residual);

 protected:
  // For subclasses that are Sequentials under another name (torchvision's
  // Conv2dNormActivation).
  explicit Sequential(std::string type_name);

 private:
  // The children [0, end) in order, a BatchNorm2d and the activation after it as one op.
  Tensor run(const Tensor& input, size_t end);

  std::vector<ModulePtr> modules_;
};

// 2-D convolution with square kernel/stride/padding/dilation. Parameters: weight
// [out, in/groups, k, k], bias [out] (when bias). Default init as torch: kaiming-uniform with
// a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
// Conv2d's settings by name, as libtorch's torch::nn::Conv2dOptions, so that a call cannot
// swap padding and dilation by position:
//   nn::Conv2d conv(nn::Conv2dOptions(3, 16, 3).stride(2).padding(1).bias(false));
struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  Conv2dOptions& stride(int64_t v) { return stride_ = v, *this; }
  Conv2dOptions& padding(int64_t v) { return padding_ = v, *this; }
  Conv2dOptions& dilation(int64_t v) { return dilation_ = v, *this; }
  Conv2dOptions& groups(int64_t v) { return groups_ = v, *this; }
  Conv2dOptions& bias(bool v) { return bias_ = v, *this; }

  int64_t in_channels_, out_channels_, kernel_size_;
  int64_t stride_ = 1, padding_ = 0, dilation_ = 1, groups_ = 1;
  bool bias_ = true;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  // The positional form (PyTorch's argument order); prefer Conv2dOptions.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& input) override;
  void reset_parameters(Generator& gen = default_generator());

  const int64_t in_channels, out_channels, kernel_size, stride, padding, dilation, groups;
  Tensor weight;
  Tensor bias;  // undefined without bias

 protected:
  std::string extra_repr() const override;
};

// Batch normalisation over N,H,W of [N,C,H,W]. Parameters weight (ones), bias (zeros);
// buffers running_mean (zeros), running_var (ones), num_batches_tracked (i64 scalar, counted
// up by every training-mode forward). momentum follows PyTorch:
// running = (1 - momentum) * running + momentum * batch.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true);
  Tensor forward(const Tensor& input) override;
  // The normalisation followed by act, as one op (see batch_norm_act).
  Tensor forward(const Tensor& input, Activation act);
  void reset_parameters();

  const int64_t num_features;
  const double eps, momentum;
  Tensor weight, bias;  // undefined when !affine
  Tensor running_mean, running_var, num_batches_tracked;

 protected:
  std::string extra_repr() const override;
};

// y = x W^T + b. weight [out, in], bias [out]. Default init as torch (see Conv2d).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  void reset_parameters(Generator& gen = default_generator());

  const int64_t in_features, out_features;
  Tensor weight;
  Tensor bias;  // undefined without bias

 protected:
  std::string extra_repr() const override;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override { return relu(input); }
};

class Hardswish : public Module {
 public:
  Hardswish() : Module("Hardswish") {}
  Tensor forward(const Tensor& input) override { return hardswish(input); }
};

class Hardsigmoid : public Module {
 public:
  Hardsigmoid() : Module("Hardsigmoid") {}
  Tensor forward(const Tensor& input) override { return hardsigmoid(input); }
};

// Inverted dropout in training mode, identity in eval mode. Draws from gen (by default the
// process-wide generator), which must outlive the module.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator& gen = default_generator());
  Tensor forward(const Tensor& input) override;

  const double p;

 protected:
  std::string extra_repr() const override;

 private:
  Generator* gen_;
};

// Average pooling to an output_height x output_width grid (torch's adaptive windows); output
// size 1 is global average pooling, [N,C,H,W] -> [N,C,1,1].
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int64_t output_size = 1)
      : AdaptiveAvgPool2d(output_size, output_size) {}
  AdaptiveAvgPool2d(int64_t output_height, int64_t output_width);
  Tensor forward(const Tensor& input) override;
  const int64_t output_height, output_width;

 protected:
  std::string extra_repr() const override;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim, end_dim); }

  const int64_t start_dim, end_dim;

 protected:
  std::string extra_repr() const override;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

}  // namespace dpar::nn
