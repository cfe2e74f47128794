#include "dpar/optim/clip_grad.h"

#include <cmath>

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"

namespace dpar::optim {
namespace {

// Every gradient of params that is defined.
std::vector<Tensor> gradients_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  return clip_gradients_by_norm(gradients_of(params), max_norm, {});
}

double clip_grad_norm(Optimizer& optimizer, double max_norm) {
  return clip_gradients_by_norm(gradients_of(optimizer.params()), max_norm,
                                optimizer.cross_shard_sum());
}

double clip_gradients_by_norm(const std::vector<Tensor>& grads, double max_norm,
                              const Optimizer::CrossShardSum& cross_shard_sum) {
  DPAR_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ",
             max_norm);
  NoGradGuard no_grad;
  double squares = 0;
  for (const Tensor& g : grads) {
    DPAR_CHECK(g.dtype() == DType::f32, "clip_grad_norm: a gradient has dtype ",
               dtype_name(g.dtype()), ", expected f32");
    if (g.numel() > 0) squares += sum(mul(g, g)).item();
  }
  if (cross_shard_sum) {
    // Each rank holds a slice: the norm is over all of them, and every rank clips alike.
    Tensor total = Tensor::full({1}, squares);
    cross_shard_sum(total);
    squares = total.item();
  }
  const double norm = std::sqrt(squares);
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1) {
    for (const Tensor& g : grads) {
      Tensor target = g;
      mul_(target, coefficient);
    }
  }
  return norm;
}

}  // namespace dpar::optim
