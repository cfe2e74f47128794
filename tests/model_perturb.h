#pragma once
// Moves a model's BatchNorm statistics, affine parameters and biases off their init values (1
// and 0). At init, an eval-mode MobileNetV3 passes almost no signal (its logits are ~1e-11 and
// its probabilities exactly 1/classes), so a comparison of two runtimes on it checks nothing;
// perturbed, the outputs carry every layer's arithmetic, and BatchNorm folding is exercised.
#include <string>
#include <vector>

#include "dpar/dpar.h"

namespace dpar::testing {

inline void perturb_model(nn::Module& model) {
  NoGradGuard no_grad;
  Generator gen(11);
  auto fill = [&](Tensor& t, float lo, float hi, bool normal) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (float& x : v) x = normal ? lo + hi * gen.normal() : lo + (hi - lo) * gen.uniform();
    t.copy_(Tensor::from_vector(v, t.shape()));
  };
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (auto& [name, t] : model.named_buffers()) {
    if (ends_with(name, "running_mean")) fill(t, 0.f, 0.1f, true);
    if (ends_with(name, "running_var")) fill(t, 0.5f, 1.5f, false);
  }
  for (auto& [name, t] : model.named_parameters()) {
    if (t.dim() == 1 && ends_with(name, "weight")) fill(t, 0.5f, 1.5f, false);
    if (ends_with(name, "bias")) fill(t, 0.f, 0.05f, true);
  }
}

}  // namespace dpar::testing
