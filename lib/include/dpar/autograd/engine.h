#pragma once
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::autograd {

// Runs the backward pass from roots. Nodes run when all their gradient inputs have arrived,
// latest-created first; gradients into leaves are accumulated into .grad and the leaves'
// gradient-ready hooks fire right then. Without retain_graph, saved tensors are freed as
// nodes finish. The backward functions themselves run with grad mode off.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph = false);

}  // namespace dpar::autograd
