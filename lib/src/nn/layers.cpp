#include "dpar/nn/layers.h"

#include <cmath>
#include <sstream>
#include <typeinfo>

#include "dpar/autograd/grad_mode.h"
#include "dpar/nn/init.h"
#include "tensor/core_kernels.h"

namespace dpar::nn {

// ---- Sequential --------------------------------------------------------------------------
Sequential::Sequential() : Module("Sequential") {}
Sequential::Sequential(std::string type_name) : Module(std::move(type_name)) {}

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(const std::vector<ModulePtr>& modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

const ModulePtr& Sequential::operator[](size_t index) const {
  DPAR_CHECK(index < modules_.size(), "Sequential: index ", index, " out of range for ",
             modules_.size(), " modules");
  return modules_[index];
}

namespace {

// The activation a child module is, when it is exactly nn::ReLU or nn::Hardswish (a subclass
// may compute something else).
Activation fusable_activation(const Module& m) {
  if (typeid(m) == typeid(ReLU)) return Activation::relu;
  if (typeid(m) == typeid(Hardswish)) return Activation::hardswish;
  return Activation::none;
}

}  // namespace

Tensor Sequential::forward(const Tensor& input) { return run(input, modules_.size()); }

Tensor Sequential::forward_add(const Tensor& input, const Tensor& residual) {
  // The last child that is not a dropout acting as the identity.
  size_t last = modules_.size();
  while (last > 0) {
    const Module& m = *modules_[last - 1];
    if (typeid(m) != typeid(Dropout)) break;
    if (m.is_training() && static_cast<const Dropout&>(m).p > 0.0) break;
    --last;
  }
  if (last > 0 && typeid(*modules_[last - 1]) == typeid(Linear)) {
    const auto& linear = static_cast<const Linear&>(*modules_[last - 1]);
    return linear_add(run(input, last - 1), linear.weight, linear.bias, residual);
  }
  return add(forward(input), residual);
}

Tensor Sequential::run(const Tensor& input, size_t end) {
  Tensor x = input;
  for (size_t i = 0; i < end; ++i) {
    const Module& m = *modules_[i];
    // BatchNorm2d then ReLU/Hardswish runs as one fused op (same results, one pass less over
    // the activation in backward, and only the normalised output kept for it).
    if (typeid(m) == typeid(BatchNorm2d) && i + 1 < end) {
      const Activation act = fusable_activation(*modules_[i + 1]);
      if (act != Activation::none) {
        x = static_cast<BatchNorm2d&>(*modules_[i]).forward(x, act);
        ++i;
        continue;
      }
    }
    x = modules_[i]->forward(x);
  }
  return x;
}

// ---- Conv2d ------------------------------------------------------------------------------
Conv2d::Conv2d(const Conv2dOptions& o)
    : Conv2d(o.in_channels_, o.out_channels_, o.kernel_size_, o.stride_, o.padding_, o.dilation_,
             o.groups_, o.bias_) {}

Conv2d::Conv2d(int64_t in_channels_, int64_t out_channels_, int64_t kernel_size_, int64_t stride_,
               int64_t padding_, int64_t dilation_, int64_t groups_, bool bias_)
    : Module("Conv2d"),
      in_channels(in_channels_),
      out_channels(out_channels_),
      kernel_size(kernel_size_),
      stride(stride_),
      padding(padding_),
      dilation(dilation_),
      groups(groups_) {
  DPAR_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0,
             "Conv2d: channels and kernel size must be positive, got in=", in_channels,
             " out=", out_channels, " kernel=", kernel_size);
  DPAR_CHECK(stride > 0 && dilation > 0 && padding >= 0, "Conv2d: invalid stride ", stride,
             ", padding ", padding, " or dilation ", dilation);
  DPAR_CHECK(groups > 0 && in_channels % groups == 0 && out_channels % groups == 0,
             "Conv2d: groups ", groups, " must divide in_channels ", in_channels,
             " and out_channels ", out_channels);
  weight = register_parameter(
      "weight", Tensor::empty({out_channels, in_channels / groups, kernel_size, kernel_size}));
  if (bias_) bias = register_parameter("bias", Tensor::empty({out_channels}));
  reset_parameters();
}

void Conv2d::reset_parameters(Generator& gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn,
                         init::Nonlinearity::LeakyReLU, gen);
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(weight.numel() / out_channels));
    init::uniform_(bias, -bound, bound, gen);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  dpar::Conv2dOptions options;
  options.stride = {stride, stride};
  options.padding = {padding, padding};
  options.dilation = {dilation, dilation};
  options.groups = groups;
  return conv2d(input, weight, bias, options);
}

std::string Conv2d::extra_repr() const {
  std::ostringstream os;
  os << in_channels << ", " << out_channels << ", kernel_size=" << kernel_size
     << ", stride=" << stride;
  if (padding != 0) os << ", padding=" << padding;
  if (dilation != 1) os << ", dilation=" << dilation;
  if (groups != 1) os << ", groups=" << groups;
  if (!bias.defined()) os << ", bias=False";
  return os.str();
}

// ---- BatchNorm2d -------------------------------------------------------------------------
BatchNorm2d::BatchNorm2d(int64_t num_features_, double eps_, double momentum_, bool affine)
    : Module("BatchNorm2d"), num_features(num_features_), eps(eps_), momentum(momentum_) {
  DPAR_CHECK(num_features > 0, "BatchNorm2d: num_features must be positive, got ", num_features);
  DPAR_CHECK(eps > 0, "BatchNorm2d: eps must be positive, got ", eps);
  DPAR_CHECK(momentum >= 0 && momentum <= 1, "BatchNorm2d: momentum must be in [0, 1], got ",
             momentum);
  if (affine) {
    weight = register_parameter("weight", Tensor::empty({num_features}));
    bias = register_parameter("bias", Tensor::empty({num_features}));
  }
  running_mean = register_buffer("running_mean", Tensor::empty({num_features}));
  running_var = register_buffer("running_var", Tensor::empty({num_features}));
  num_batches_tracked = register_buffer("num_batches_tracked", Tensor::empty({}, DType::i64));
  reset_parameters();
}

void BatchNorm2d::reset_parameters() {
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor BatchNorm2d::forward(const Tensor& input) { return forward(input, Activation::none); }

Tensor BatchNorm2d::forward(const Tensor& input, Activation act) {
  DPAR_CHECK(input.dim() == 4 && input.size(1) == num_features, "BatchNorm2d: expected [N,",
             num_features, ",H,W] input, got ", input.shape());
  if (is_training()) {
    // A bookkeeping counter (torch reads it only when momentum is None), bumped where it
    // lives: on a GPU a read back to the host would synchronise once per layer and step.
    if (num_batches_tracked.dtype() == DType::i64 && num_batches_tracked.is_dense()) {
      kernels::count_up.get(num_batches_tracked.device())(num_batches_tracked);
    } else {
      NoGradGuard no_grad;
      num_batches_tracked.fill_(num_batches_tracked.item() + 1.0);
    }
  }
  return batch_norm_act(input, weight, bias, running_mean, running_var, is_training(), momentum,
                        eps, act);
}

std::string BatchNorm2d::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << eps << ", momentum=" << momentum
     << ", affine=" << (weight.defined() ? "True" : "False");
  return os.str();
}

// ---- Linear ------------------------------------------------------------------------------
Linear::Linear(int64_t in_features_, int64_t out_features_, bool bias_)
    : Module("Linear"), in_features(in_features_), out_features(out_features_) {
  DPAR_CHECK(in_features > 0 && out_features > 0,
             "Linear: features must be positive, got in=", in_features, " out=", out_features);
  weight = register_parameter("weight", Tensor::empty({out_features, in_features}));
  if (bias_) bias = register_parameter("bias", Tensor::empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters(Generator& gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn,
                         init::Nonlinearity::LeakyReLU, gen);
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    init::uniform_(bias, -bound, bound, gen);
  }
}

Tensor Linear::forward(const Tensor& input) {
  DPAR_CHECK(input.dim() >= 1 && input.size(-1) == in_features, "Linear: expected input [...,",
             in_features, "], got ", input.shape());
  return linear(input, weight, bias);  // leading dims are batch dims (the op flattens them)
}

std::string Linear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << in_features << ", out_features=" << out_features
     << ", bias=" << (bias.defined() ? "True" : "False");
  return os.str();
}

// ---- Dropout, pooling, flatten -----------------------------------------------------------
Dropout::Dropout(double p_, Generator& gen) : Module("Dropout"), p(p_), gen_(&gen) {
  DPAR_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& input) { return dropout(input, p, is_training(), *gen_); }

std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << p;
  return os.str();
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t h, int64_t w)
    : Module("AdaptiveAvgPool2d"), output_height(h), output_width(w) {
  DPAR_CHECK(h > 0 && w > 0, "AdaptiveAvgPool2d: output size must be positive, got ", h, "x", w);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) {
  // 1x1 is the global mean: its own kernels (the SE block's hot path).
  if (output_height == 1 && output_width == 1) return global_avg_pool2d(input);
  return adaptive_avg_pool2d(input, {output_height, output_width});
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  std::ostringstream os;
  os << "output_size=";
  if (output_height == output_width) {
    os << output_height;
  } else {
    os << "(" << output_height << ", " << output_width << ")";
  }
  return os.str();
}

Flatten::Flatten(int64_t start_dim_, int64_t end_dim_)
    : Module("Flatten"), start_dim(start_dim_), end_dim(end_dim_) {}

std::string Flatten::extra_repr() const {
  std::ostringstream os;
  os << "start_dim=" << start_dim << ", end_dim=" << end_dim;
  return os.str();
}

}  // namespace dpar::nn
