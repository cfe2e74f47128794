#pragma once
// Gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ (norm type 2): the norm of all
// gradients taken together; when it exceeds max_norm every gradient is multiplied by
// max_norm / (norm + 1e-6). Returns the norm before clipping.
//
// clip_grad_norm(optimizer, ...) is the form that is right everywhere: a single process,
// unsharded DataParallel (every rank holds the same averaged gradients, so nothing is
// communicated) and sharded DataParallel, where each rank holds a slice of the gradients: the
// sum of squares of the slices is summed over the ranks once (the optimizer's cross_shard_sum,
// one small all-reduce), so every rank clips by the global norm, not by its slice's.
#include <vector>

#include "dpar/optim/optimizer.h"
#include "dpar/tensor/tensor.h"

namespace dpar::optim {

// The defined gradients of params (f32, any device). max_norm > 0 and finite.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The optimizer's parameters' gradients, summed over shards when it holds slices.
double clip_grad_norm(Optimizer& optimizer, double max_norm);
// The gradients themselves (e.g. dpar views of libtorch's), clipped in place; cross_shard_sum,
// when set, sums a one-element f32 tensor (the local sum of squares) over the ranks that
// hold the other slices.
double clip_gradients_by_norm(const std::vector<Tensor>& grads, double max_norm,
                              const Optimizer::CrossShardSum& cross_shard_sum);

}  // namespace dpar::optim
