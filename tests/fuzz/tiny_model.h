#pragma once
// The small network the fuzz targets load into and the seed maker writes files of: a conv,
// batch norm, pooling and a classifier, so checkpoints carry weights, running statistics and
// optimizer buffers, and the exported ONNX graph has Conv, Relu, GlobalAveragePool and Gemm.
#include <memory>

#include "dpar/nn/layers.h"
#include "dpar/optim/sgd.h"

namespace dpar::fuzz {

inline std::shared_ptr<nn::Sequential> make_tiny_net() {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::BatchNorm2d>(4),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::AdaptiveAvgPool2d>(1),
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4, 3)});
}

struct TinyRun {
  std::shared_ptr<nn::Sequential> net = make_tiny_net();
  optim::SGD opt{net->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9}};
};

// Input side of the tiny net as exported (square images of this side).
inline constexpr int64_t kTinyImageSide = 8;

}  // namespace dpar::fuzz
