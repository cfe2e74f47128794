#pragma once
// MobileNetV3 small and large, built exactly as torchvision 0.14 builds them: the same
// modules, the same state-dict names (features.<i>.block.<j>...), the same shapes and the same
// initialisation, so weights load into and out of torchvision's models unchanged.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dpar/core/random.h"
#include "dpar/nn/layers.h"
#include "dpar/nn/module.h"

namespace dpar::models {

// torchvision's _make_divisible: round to the nearest multiple of divisor (at least divisor),
// never more than 10% below v.
int64_t make_divisible(double v, int64_t divisor = 8);

// One bottleneck row of the paper's tables 1 and 2; channels are already width-adjusted.
struct InvertedResidualConfig {
  InvertedResidualConfig(int64_t input_channels, int64_t kernel, int64_t expanded_channels,
                         int64_t out_channels, bool use_se, bool use_hardswish, int64_t stride,
                         int64_t dilation = 1, double width_mult = 1.0);
  int64_t input_channels, kernel, expanded_channels, out_channels;
  bool use_se, use_hardswish;
  int64_t stride, dilation;
};

struct MobileNetV3Setting {
  std::vector<InvertedResidualConfig> blocks;
  int64_t last_channel;  // classifier hidden width
};

// torchvision's _mobilenet_v3_conf for "mobilenet_v3_small" / "mobilenet_v3_large".
MobileNetV3Setting mobilenet_v3_conf(const std::string& arch, double width_mult = 1.0,
                                     bool reduced_tail = false, bool dilated = false);

// Conv2d (no bias when normalised) -> BatchNorm2d -> activation, children "0", "1", "2";
// padding (kernel - 1) / 2 * dilation. activation: "relu", "hardswish" or "" (none).
class Conv2dNormActivation : public nn::Sequential {
 public:
  Conv2dNormActivation(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                       int64_t stride, int64_t groups, const std::string& activation,
                       int64_t dilation = 1);
};

// scale = hardsigmoid(fc2(relu(fc1(avgpool(x))))); returns scale * x.
class SqueezeExcitation : public nn::Module {
 public:
  SqueezeExcitation(int64_t input_channels, int64_t squeeze_channels);
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Conv2d> fc1, fc2;
  std::shared_ptr<nn::ReLU> activation;
  std::shared_ptr<nn::Hardsigmoid> scale_activation;
};

// expand (1x1, when expanded != input) -> depthwise kxk -> SE (optional) -> project (1x1, no
// activation), in the child Sequential "block"; adds the input when stride 1 and in == out.
class InvertedResidual : public nn::Module {
 public:
  explicit InvertedResidual(const InvertedResidualConfig& cnf);
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<nn::Sequential> block;
  const bool use_res_connect;
  const int64_t out_channels;
};

class MobileNetV3 : public nn::Module {
 public:
  // Initialises as torchvision: conv kaiming-normal (fan_out), conv biases 0, BN 1 / 0,
  // Linear normal(0, 0.01) with bias 0, drawing from gen.
  MobileNetV3(const MobileNetV3Setting& setting, int64_t num_classes = 1000, double dropout = 0.2,
              Generator& gen = default_generator());
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<nn::Sequential> features;
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Sequential> classifier;

 private:
  void initialize(Generator& gen);
};

std::shared_ptr<MobileNetV3> mobilenet_v3_small(int64_t num_classes = 1000, double dropout = 0.2);
std::shared_ptr<MobileNetV3> mobilenet_v3_large(int64_t num_classes = 1000, double dropout = 0.2);
// By name: "mobilenet_v3_small" or "mobilenet_v3_large" (throws dpar::Error otherwise).
std::shared_ptr<MobileNetV3> mobilenet_v3(const std::string& arch, int64_t num_classes = 1000,
                                          double dropout = 0.2);

}  // namespace dpar::models
