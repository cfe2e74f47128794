#include "model/mobilenet_v3.h"

#include <algorithm>
#include <cmath>

#include "dpar/nn/init.h"
#include "dpar/tensor/ops.h"

namespace dpar::models {

namespace {
// torchvision's norm_layer for MobileNetV3: partial(BatchNorm2d, eps=0.001, momentum=0.01).
constexpr double kBnEps = 0.001;
constexpr double kBnMomentum = 0.01;

nn::ModulePtr make_activation(const std::string& name) {
  if (name == "relu") return std::make_shared<nn::ReLU>();
  if (name == "hardswish") return std::make_shared<nn::Hardswish>();
  DPAR_FAIL("Conv2dNormActivation: unknown activation '", name, "'");
}
}  // namespace

int64_t make_divisible(double v, int64_t divisor) {
  const int64_t rounded =
      static_cast<int64_t>(v + static_cast<double>(divisor) / 2.0) / divisor * divisor;
  int64_t out = std::max(divisor, rounded);
  if (static_cast<double>(out) < 0.9 * v) out += divisor;
  return out;
}

InvertedResidualConfig::InvertedResidualConfig(int64_t input, int64_t kernel_, int64_t expanded,
                                               int64_t out, bool se, bool hardswish,
                                               int64_t stride_, int64_t dilation_,
                                               double width_mult)
    : input_channels(make_divisible(static_cast<double>(input) * width_mult)),
      kernel(kernel_),
      expanded_channels(make_divisible(static_cast<double>(expanded) * width_mult)),
      out_channels(make_divisible(static_cast<double>(out) * width_mult)),
      use_se(se),
      use_hardswish(hardswish),
      stride(stride_),
      dilation(dilation_) {}

MobileNetV3Setting mobilenet_v3_conf(const std::string& arch, double width_mult, bool reduced_tail,
                                     bool dilated) {
  const int64_t rd = reduced_tail ? 2 : 1;  // reduce_divider
  const int64_t dil = dilated ? 2 : 1;
  const bool SE = true, NO = false, HS = true, RE = false;
  auto b = [&](int64_t in, int64_t k, int64_t exp, int64_t out, bool se, bool hs, int64_t s,
               int64_t d) {
    return InvertedResidualConfig(in, k, exp, out, se, hs, s, d, width_mult);
  };
  MobileNetV3Setting setting;
  if (arch == "mobilenet_v3_large") {
    setting.blocks = {
        b(16, 3, 16, 16, NO, RE, 1, 1),
        b(16, 3, 64, 24, NO, RE, 2, 1),  // C1
        b(24, 3, 72, 24, NO, RE, 1, 1),
        b(24, 5, 72, 40, SE, RE, 2, 1),  // C2
        b(40, 5, 120, 40, SE, RE, 1, 1),
        b(40, 5, 120, 40, SE, RE, 1, 1),
        b(40, 3, 240, 80, NO, HS, 2, 1),  // C3
        b(80, 3, 200, 80, NO, HS, 1, 1),
        b(80, 3, 184, 80, NO, HS, 1, 1),
        b(80, 3, 184, 80, NO, HS, 1, 1),
        b(80, 3, 480, 112, SE, HS, 1, 1),
        b(112, 3, 672, 112, SE, HS, 1, 1),
        b(112, 5, 672, 160 / rd, SE, HS, 2, dil),  // C4
        b(160 / rd, 5, 960 / rd, 160 / rd, SE, HS, 1, dil),
        b(160 / rd, 5, 960 / rd, 160 / rd, SE, HS, 1, dil),
    };
    setting.last_channel = make_divisible(static_cast<double>(1280 / rd) * width_mult);  // C5
  } else if (arch == "mobilenet_v3_small") {
    setting.blocks = {
        b(16, 3, 16, 16, SE, RE, 2, 1),  // C1
        b(16, 3, 72, 24, NO, RE, 2, 1),  // C2
        b(24, 3, 88, 24, NO, RE, 1, 1),
        b(24, 5, 96, 40, SE, HS, 2, 1),  // C3
        b(40, 5, 240, 40, SE, HS, 1, 1),
        b(40, 5, 240, 40, SE, HS, 1, 1),
        b(40, 5, 120, 48, SE, HS, 1, 1),
        b(48, 5, 144, 48, SE, HS, 1, 1),
        b(48, 5, 288, 96 / rd, SE, HS, 2, dil),  // C4
        b(96 / rd, 5, 576 / rd, 96 / rd, SE, HS, 1, dil),
        b(96 / rd, 5, 576 / rd, 96 / rd, SE, HS, 1, dil),
    };
    setting.last_channel = make_divisible(static_cast<double>(1024 / rd) * width_mult);  // C5
  } else {
    DPAR_FAIL("mobilenet_v3: unsupported architecture '", arch,
              "' (expected mobilenet_v3_small or mobilenet_v3_large)");
  }
  return setting;
}

// ---- building blocks ---------------------------------------------------------------------
Conv2dNormActivation::Conv2dNormActivation(int64_t in_channels, int64_t out_channels,
                                           int64_t kernel_size, int64_t stride, int64_t groups,
                                           const std::string& activation, int64_t dilation)
    : Sequential("Conv2dNormActivation") {
  const int64_t padding = (kernel_size - 1) / 2 * dilation;
  push_back(std::make_shared<nn::Conv2d>(in_channels, out_channels, kernel_size, stride, padding,
                                         dilation, groups, /*bias=*/false));
  push_back(std::make_shared<nn::BatchNorm2d>(out_channels, kBnEps, kBnMomentum));
  if (!activation.empty()) push_back(make_activation(activation));
}

SqueezeExcitation::SqueezeExcitation(int64_t input_channels, int64_t squeeze_channels)
    : Module("SqueezeExcitation") {
  // Registration order is torchvision's: avgpool, fc1, fc2, activation, scale_activation.
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  fc1 = register_module("fc1", std::make_shared<nn::Conv2d>(input_channels, squeeze_channels, 1));
  fc2 = register_module("fc2", std::make_shared<nn::Conv2d>(squeeze_channels, input_channels, 1));
  activation = register_module("activation", std::make_shared<nn::ReLU>());
  scale_activation = register_module("scale_activation", std::make_shared<nn::Hardsigmoid>());
}

Tensor SqueezeExcitation::forward(const Tensor& input) {
  Tensor scale = avgpool->forward(input);
  scale = activation->forward(fc1->forward(scale));
  scale = scale_activation->forward(fc2->forward(scale));
  return mul(scale, input);
}

InvertedResidual::InvertedResidual(const InvertedResidualConfig& cnf)
    : Module("InvertedResidual"),
      use_res_connect(cnf.stride == 1 && cnf.input_channels == cnf.out_channels),
      out_channels(cnf.out_channels) {
  DPAR_CHECK(cnf.stride == 1 || cnf.stride == 2, "InvertedResidual: illegal stride ", cnf.stride);
  const std::string act = cnf.use_hardswish ? "hardswish" : "relu";
  block = std::make_shared<nn::Sequential>();
  if (cnf.expanded_channels != cnf.input_channels) {  // expand
    block->push_back(std::make_shared<Conv2dNormActivation>(cnf.input_channels,
                                                            cnf.expanded_channels, 1, 1, 1, act));
  }
  const int64_t stride = cnf.dilation > 1 ? 1 : cnf.stride;  // depthwise
  block->push_back(std::make_shared<Conv2dNormActivation>(
      cnf.expanded_channels, cnf.expanded_channels, cnf.kernel, stride, cnf.expanded_channels, act,
      cnf.dilation));
  if (cnf.use_se) {
    block->push_back(std::make_shared<SqueezeExcitation>(
        cnf.expanded_channels, make_divisible(static_cast<double>(cnf.expanded_channels / 4))));
  }
  block->push_back(std::make_shared<Conv2dNormActivation>(cnf.expanded_channels,  // project
                                                          cnf.out_channels, 1, 1, 1, ""));
  register_module("block", block);
}

Tensor InvertedResidual::forward(const Tensor& input) {
  Tensor result = block->forward(input);
  if (use_res_connect) result = add(result, input);
  return result;
}

// ---- the network -------------------------------------------------------------------------
MobileNetV3::MobileNetV3(const MobileNetV3Setting& setting, int64_t num_classes, double dropout,
                         Generator& gen)
    : Module("MobileNetV3") {
  DPAR_CHECK(!setting.blocks.empty(), "MobileNetV3: the block setting is empty");
  DPAR_CHECK(num_classes > 0, "MobileNetV3: num_classes must be positive, got ", num_classes);
  features = std::make_shared<nn::Sequential>();
  features->push_back(std::make_shared<Conv2dNormActivation>(
      3, setting.blocks.front().input_channels, 3, 2, 1, "hardswish"));
  for (const auto& cnf : setting.blocks)
    features->push_back(std::make_shared<InvertedResidual>(cnf));
  const int64_t last_in = setting.blocks.back().out_channels;
  const int64_t last_out = 6 * last_in;
  features->push_back(
      std::make_shared<Conv2dNormActivation>(last_in, last_out, 1, 1, 1, "hardswish"));
  register_module("features", features);
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  classifier = register_module(
      "classifier", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                        std::make_shared<nn::Linear>(last_out, setting.last_channel),
                        std::make_shared<nn::Hardswish>(), std::make_shared<nn::Dropout>(dropout),
                        std::make_shared<nn::Linear>(setting.last_channel, num_classes)}));
  initialize(gen);
}

void MobileNetV3::initialize(Generator& gen) {
  // torchvision walks self.modules() (pre-order, registration order) and re-initialises.
  for (auto& [name, m] : named_modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(m)) {
      nn::init::kaiming_normal_(conv->weight, 0.0, nn::init::FanMode::FanOut,
                                nn::init::Nonlinearity::LeakyReLU, gen);
      if (conv->bias.defined()) nn::init::zeros_(conv->bias);
    } else if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m)) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    } else if (auto* fc = dynamic_cast<nn::Linear*>(m)) {
      nn::init::normal_(fc->weight, 0.0, 0.01, gen);
      nn::init::zeros_(fc->bias);
    }
  }
}

Tensor MobileNetV3::forward(const Tensor& input) {
  DPAR_CHECK(input.dim() == 4 && input.size(1) == 3, "MobileNetV3: expected [N,3,H,W] input, got ",
             input.shape());
  Tensor x = features->forward(input);
  x = avgpool->forward(x).flatten(1);
  return classifier->forward(x);
}

std::shared_ptr<MobileNetV3> mobilenet_v3(const std::string& arch, int64_t num_classes,
                                          double dropout) {
  return std::make_shared<MobileNetV3>(mobilenet_v3_conf(arch), num_classes, dropout);
}

std::shared_ptr<MobileNetV3> mobilenet_v3_small(int64_t num_classes, double dropout) {
  return mobilenet_v3("mobilenet_v3_small", num_classes, dropout);
}

std::shared_ptr<MobileNetV3> mobilenet_v3_large(int64_t num_classes, double dropout) {
  return mobilenet_v3("mobilenet_v3_large", num_classes, dropout);
}

}  // namespace dpar::models
