// LayerNorm, GroupNorm, BatchNorm1d, MaxPool2d and AvgPool2d modules.
#include <sstream>

#include "dpar/nn/init.h"
#include "dpar/nn/normalization.h"
#include "dpar/nn/pooling.h"

namespace dpar::nn {

LayerNorm::LayerNorm(Shape shape, double eps_, bool elementwise_affine)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  DPAR_CHECK(!normalized_shape.empty() && shape_numel(normalized_shape) > 0,
             "LayerNorm: normalized_shape must name at least one non-empty dim, got ",
             normalized_shape);
  DPAR_CHECK(eps >= 0, "LayerNorm: eps must be non-negative, got ", eps);
  if (elementwise_affine) {
    weight = register_parameter("weight", Tensor::empty(normalized_shape));
    bias = register_parameter("bias", Tensor::empty(normalized_shape));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& input) {
  return layer_norm(input, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < normalized_shape.size(); ++i) {
    os << (i ? ", " : "") << normalized_shape[i];
  }
  os << (normalized_shape.size() == 1 ? ",)" : ")") << ", eps=" << eps
     << ", elementwise_affine=" << (weight.defined() ? "True" : "False");
  return os.str();
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine)
    : Module("GroupNorm"), num_groups(groups), num_channels(channels), eps(eps_) {
  DPAR_CHECK(groups > 0 && channels > 0 && channels % groups == 0, "GroupNorm: ", channels,
             " channels cannot be split into ", groups, " groups");
  if (affine) {
    weight = register_parameter("weight", Tensor::ones({channels}));
    bias = register_parameter("bias", Tensor::zeros({channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& input) {
  DPAR_CHECK(input.dim() >= 2 && input.size(1) == num_channels, "GroupNorm: expected [N,",
             num_channels, ",...] input, got ", input.shape());
  return group_norm(input, num_groups, weight, bias, eps);
}

std::string GroupNorm::extra_repr() const {
  std::ostringstream os;
  os << num_groups << ", " << num_channels << ", eps=" << eps
     << ", affine=" << (weight.defined() ? "True" : "False");
  return os.str();
}

BatchNorm1d::BatchNorm1d(int64_t num_features_, double eps_, double momentum_, bool affine)
    : BatchNorm2d(num_features_, eps_, momentum_, affine) {
  set_type_name("BatchNorm1d");
}

Tensor BatchNorm1d::forward(const Tensor& input) {
  DPAR_CHECK((input.dim() == 2 || input.dim() == 3) && input.size(1) == num_features,
             "BatchNorm1d: expected [N,", num_features, "] or [N,", num_features, ",L] input, got ",
             input.shape());
  // BatchNorm2d's forward on the [N,C,L,1] view: the same statistics, counters and buffers.
  const Shape shape4 = input.dim() == 2 ? Shape{input.size(0), input.size(1), 1, 1}
                                        : Shape{input.size(0), input.size(1), input.size(2), 1};
  return BatchNorm2d::forward(input.reshape(shape4), Activation::none).reshape(input.shape());
}

MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t p, bool ceil)
    : Module("MaxPool2d"), kernel_size(k), stride(s == 0 ? k : s), padding(p), ceil_mode(ceil) {
  DPAR_CHECK(k > 0 && stride > 0 && p >= 0, "MaxPool2d: invalid kernel_size ", k, ", stride ",
             stride, " or padding ", p);
}

Tensor MaxPool2d::forward(const Tensor& input) {
  return max_pool2d(input, {kernel_size}, {stride}, {padding}, ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  std::ostringstream os;
  os << "kernel_size=" << kernel_size << ", stride=" << stride << ", padding=" << padding
     << ", dilation=1, ceil_mode=" << (ceil_mode ? "True" : "False");
  return os.str();
}

AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t p, bool ceil, bool include_pad)
    : Module("AvgPool2d"),
      kernel_size(k),
      stride(s == 0 ? k : s),
      padding(p),
      ceil_mode(ceil),
      count_include_pad(include_pad) {
  DPAR_CHECK(k > 0 && stride > 0 && p >= 0, "AvgPool2d: invalid kernel_size ", k, ", stride ",
             stride, " or padding ", p);
}

Tensor AvgPool2d::forward(const Tensor& input) {
  return avg_pool2d(input, {kernel_size}, {stride}, {padding}, ceil_mode, count_include_pad);
}

std::string AvgPool2d::extra_repr() const {
  std::ostringstream os;
  os << "kernel_size=" << kernel_size << ", stride=" << stride << ", padding=" << padding;
  return os.str();
}

}  // namespace dpar::nn
