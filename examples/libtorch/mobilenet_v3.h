#pragma once
// MobileNetV3-small with torchvision's structure and hyper-parameters (torchvision.models.
// mobilenet_v3_small: inverted residual settings, squeeze-excitation widths, BN eps 0.001 and
// momentum 0.01, hardswish/hardsigmoid, dropout 0.2), written with torch::nn, so a libtorch
// program and PyTorch's Python side train the same graph (bench_torch_ddp --model
// mobilenet_v3_small). Plain libtorch: nothing here knows about dpar.
#include <torch/torch.h>

#include <algorithm>

namespace libtorch_example {

// torchvision's _make_divisible: round to a multiple of 8, never below 90% of v.
inline int64_t make_divisible(double v, int64_t divisor = 8) {
  int64_t out =
      std::max<int64_t>(divisor, static_cast<int64_t>(v + divisor / 2.0) / divisor * divisor);
  if (static_cast<double>(out) < 0.9 * v) out += divisor;
  return out;
}

inline torch::nn::Functional hardswish() {
  return torch::nn::Functional([](const torch::Tensor& x) { return torch::hardswish(x); });
}

// Conv, BatchNorm and an activation (none, ReLU or hardswish), as Conv2dNormActivation. A
// module of its own: libtorch cannot nest a Sequential in a Sequential.
enum class Act { none, relu, hardswish };
struct ConvBnActImpl : torch::nn::Module {
  ConvBnActImpl(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups, Act act)
      : act(act) {
    conv = register_module("0", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k)
                                                      .stride(stride)
                                                      .padding((k - 1) / 2)
                                                      .groups(groups)
                                                      .bias(false)));
    bn = register_module(
        "1", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(out).eps(0.001).momentum(0.01)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = bn(conv(x));
    if (act == Act::relu) return torch::relu(x);
    if (act == Act::hardswish) return torch::hardswish(x);
    return x;
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  Act act;
};
TORCH_MODULE(ConvBnAct);

struct SqueezeExcitationImpl : torch::nn::Module {
  SqueezeExcitationImpl(int64_t channels, int64_t squeezed) {
    fc1 =
        register_module("fc1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, squeezed, 1)));
    fc2 =
        register_module("fc2", torch::nn::Conv2d(torch::nn::Conv2dOptions(squeezed, channels, 1)));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor s = torch::adaptive_avg_pool2d(x, {1, 1});
    s = torch::hardsigmoid(fc2(torch::relu(fc1(s))));
    return x * s;
  }
  torch::nn::Conv2d fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SqueezeExcitation);

struct InvertedResidualImpl : torch::nn::Module {
  InvertedResidualImpl(int64_t in, int64_t k, int64_t expanded, int64_t out, bool se, Act act,
                       int64_t stride)
      : residual(stride == 1 && in == out) {
    if (expanded != in) block->push_back(ConvBnAct(in, expanded, 1, 1, 1, act));
    block->push_back(ConvBnAct(expanded, expanded, k, stride, expanded, act));
    if (se) block->push_back(SqueezeExcitation(expanded, make_divisible(expanded / 4.0)));
    block->push_back(ConvBnAct(expanded, out, 1, 1, 1, Act::none));
    register_module("block", block);
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = block->forward(x);
    return residual ? y + x : y;
  }
  torch::nn::Sequential block;
  bool residual;
};
TORCH_MODULE(InvertedResidual);

struct MobileNetV3SmallImpl : torch::nn::Module {
  explicit MobileNetV3SmallImpl(int64_t num_classes = 1000) {
    struct Setting {
      int64_t in, k, expanded, out;
      bool se;
      Act act;
      int64_t stride;
    };
    const Act RE = Act::relu, HS = Act::hardswish;
    const Setting settings[] = {
        {16, 3, 16, 16, true, RE, 2},  {16, 3, 72, 24, false, RE, 2}, {24, 3, 88, 24, false, RE, 1},
        {24, 5, 96, 40, true, HS, 2},  {40, 5, 240, 40, true, HS, 1}, {40, 5, 240, 40, true, HS, 1},
        {40, 5, 120, 48, true, HS, 1}, {48, 5, 144, 48, true, HS, 1}, {48, 5, 288, 96, true, HS, 2},
        {96, 5, 576, 96, true, HS, 1}, {96, 5, 576, 96, true, HS, 1}};
    features->push_back(ConvBnAct(3, 16, 3, 2, 1, HS));
    for (const Setting& s : settings) {
      features->push_back(InvertedResidual(s.in, s.k, s.expanded, s.out, s.se, s.act, s.stride));
    }
    features->push_back(ConvBnAct(96, 576, 1, 1, 1, HS));
    register_module("features", features);
    classifier =
        register_module("classifier", torch::nn::Sequential(torch::nn::Linear(576, 1024),
                                                            hardswish(), torch::nn::Dropout(0.2),
                                                            torch::nn::Linear(1024, num_classes)));
    // torchvision's initialisation.
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut);
        if (conv->bias.defined()) torch::nn::init::zeros_(conv->bias);
      } else if (auto* linear = m->as<torch::nn::Linear>()) {
        torch::nn::init::normal_(linear->weight, 0, 0.01);
        torch::nn::init::zeros_(linear->bias);
      }
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = features->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return classifier->forward(x);
  }
  torch::nn::Sequential features, classifier{nullptr};
};
TORCH_MODULE(MobileNetV3Small);

}  // namespace libtorch_example
