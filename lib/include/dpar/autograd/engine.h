#pragma once
#include <functional>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::autograd {

// Runs the backward pass from roots. Nodes run when all their gradient inputs have arrived,
// latest-created first; gradients into leaves are accumulated into .grad and the leaves'
// gradient-ready hooks fire right then. Without retain_graph, saved tensors are freed as
// nodes finish. The backward functions themselves run with grad mode off.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph = false);

// Registers fn to run once, on this thread, when the backward pass currently executing
// finishes (after every node ran). Called from inside backward (e.g. a gradient-ready hook);
// DataParallel uses it to wait for its last buckets before backward() returns. Callbacks may
// throw; the exception leaves backward(). Calling it outside a backward pass is an error.
void queue_callback(std::function<void()> fn);
// True while a backward pass runs on this thread.
bool in_backward();
// Zeroes the defined gradients of `tensors` in place (they keep their storage, which matters
// when they are views into shared buckets), or with set_to_none drops them so the next
// backward allocates fresh ones. Module::zero_grad and Optimizer::zero_grad use it.
void zero_grad(const std::vector<Tensor>& tensors, bool set_to_none = false);

}  // namespace dpar::autograd
