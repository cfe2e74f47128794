#pragma once
// ResNet-18 with torchvision's structure (7x7 stride-2 stem, max pool, four stages of two
// BasicBlocks, global average pool, fully connected), written with torch::nn. in_channels = 1
// for Fashion-MNIST's grey images. Plain libtorch: nothing here knows about dpar.
#include <torch/torch.h>

namespace libtorch_example {

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    using torch::nn::Conv2dOptions;
    conv1 = register_module(
        "conv1",
        torch::nn::Conv2d(Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
    conv2 = register_module("conv2",
                            torch::nn::Conv2d(Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample", torch::nn::Sequential(
                            torch::nn::Conv2d(Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                            torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = downsample ? downsample->forward(x) : x;
    x = torch::relu(bn1(conv1(x)));
    x = bn2(conv2(x));
    return torch::relu(x + identity);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNet18Impl : torch::nn::Module {
  explicit ResNet18Impl(int64_t num_classes = 10, int64_t in_channels = 1) {
    using torch::nn::Conv2dOptions;
    conv1 = register_module(
        "conv1",
        torch::nn::Conv2d(Conv2dOptions(in_channels, 64, 7).stride(2).padding(3).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
    const int64_t widths[] = {64, 128, 256, 512};
    int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      torch::nn::Sequential layer;
      layer->push_back(BasicBlock(in, widths[stage], stage == 0 ? 1 : 2));
      layer->push_back(BasicBlock(widths[stage], widths[stage], 1));
      layers.push_back(register_module("layer" + std::to_string(stage + 1), layer));
      in = widths[stage];
    }
    fc = register_module("fc", torch::nn::Linear(512, num_classes));
    // torchvision's initialisation: Kaiming (fan_out) for convolutions, BN weight 1, bias 0.
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      }
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    x = torch::max_pool2d(x, 3, 2, 1);
    for (auto& layer : layers) x = layer->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  std::vector<torch::nn::Sequential> layers;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18);

}  // namespace libtorch_example
