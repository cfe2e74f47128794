#pragma once
// Pooling modules with torch.nn's names and reprs: MaxPool2d and AvgPool2d over square
// windows (AdaptiveAvgPool2d is in layers.h).
#include <cstdint>
#include <string>

#include "dpar/nn/module.h"
#include "dpar/tensor/ops.h"

namespace dpar::nn {

// stride 0 means "the kernel size", torch's default (stride=None).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                     bool ceil_mode = false);
  Tensor forward(const Tensor& input) override;
  const int64_t kernel_size, stride, padding;
  const bool ceil_mode;

 protected:
  std::string extra_repr() const override;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& input) override;
  const int64_t kernel_size, stride, padding;
  const bool ceil_mode, count_include_pad;

 protected:
  std::string extra_repr() const override;
};

}  // namespace dpar::nn
