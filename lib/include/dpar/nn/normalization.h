#pragma once
// LayerNorm, GroupNorm and BatchNorm1d with torch.nn's parameter and buffer names and
// default initialisation (weight ones, bias zeros).
#include <cstdint>
#include <string>

#include "dpar/nn/layers.h"

namespace dpar::nn {

// Normalises over the last dims (normalized_shape); weight and bias have that shape when
// elementwise_affine.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true)
      : LayerNorm(Shape{normalized_size}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& input) override;
  void reset_parameters();

  const Shape normalized_shape;
  const double eps;
  Tensor weight;  // undefined without elementwise_affine
  Tensor bias;

 protected:
  std::string extra_repr() const override;
};

// x [N,C,...] normalised per sample over each of num_groups groups of channels; weight and
// bias [C] when affine.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& input) override;

  const int64_t num_groups, num_channels;
  const double eps;
  Tensor weight;
  Tensor bias;

 protected:
  std::string extra_repr() const override;
};

// Batch normalisation of [N,C] or [N,C,L]: BatchNorm2d's parameters, buffers and statistics
// (torch keeps the same state dict for both).
class BatchNorm1d : public BatchNorm2d {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true);
  Tensor forward(const Tensor& input) override;
};

}  // namespace dpar::nn
