#include "dpar/optim/clip_grad.h"

#include <cmath>

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"

namespace dpar::optim {
namespace {

double clip_by_norm(const std::vector<Tensor>& params, double max_norm,
                    const Optimizer::CrossShardSum& cross_shard_sum) {
  DPAR_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ",
             max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  double squares = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    DPAR_CHECK(g.dtype() == DType::f32, "clip_grad_norm: a gradient has dtype ",
               dtype_name(g.dtype()), ", expected f32");
    grads.push_back(g);
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
    for (Tensor& g : grads) mul_(g, coefficient);
  }
  return norm;
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  return clip_by_norm(params, max_norm, {});
}

double clip_grad_norm(Optimizer& optimizer, double max_norm) {
  return clip_by_norm(optimizer.params(), max_norm, optimizer.cross_shard_sum());
}

}  // namespace dpar::optim
