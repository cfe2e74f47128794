#pragma once
// The autograd graph. Every differentiable op that sees an input requiring grad records a
// Node whose next edges point at the nodes producing its inputs' gradients: the inputs'
// grad_fn, or, for leaves (parameters), their AccumulateGrad node.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: this input needs no gradient
  uint32_t input_nr = 0;       // which of node's gradient inputs this edge feeds
  bool valid() const { return node != nullptr; }
};

// Shape, dtype and device of a forward output, so an absent gradient can be made as zeros.
struct OutputMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  // grads: one per forward output (never undefined: the engine fills zeros from OutputMeta).
  // Returns one gradient per next edge; undefined where the input needs none.
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // Frees saved tensors after the node ran (unless the graph is retained).
  virtual void release_saved() {}

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  std::vector<Edge>& mutable_next_edges() { return next_edges_; }
  const std::vector<OutputMeta>& outputs() const { return outputs_; }
  std::vector<OutputMeta>& mutable_outputs() { return outputs_; }
  // Larger runs earlier among ready nodes: reverse creation order, like PyTorch.
  uint64_t sequence_nr() const { return sequence_nr_; }

 protected:
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> outputs_;
};

// Accumulates into a leaf's .grad and then fires its gradient-ready hooks. Runs as soon as
// every path into the leaf has delivered (highest priority), so hooks fire at the earliest
// moment the gradient is final - DataParallel launches bucket all-reduces from them.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> variable);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  const std::shared_ptr<TensorImpl>& variable() const { return variable_; }

 private:
  std::shared_ptr<TensorImpl> variable_;
};

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;         // set for non-leaf results of recorded ops
  uint32_t output_nr = 0;                // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // leaves: their AccumulateGrad, created on demand
  std::vector<std::pair<int, GradReadyHook>> ready_hooks;
  int next_hook_handle = 0;
  // How to make this tensor's values again from what the backward of its producer keeps anyway
  // (e.g. an activation from the batch norm output its op saved): an op that needs the tensor in
  // its backward then keeps this recipe instead (SavedTensor), and the tensor itself is freed
  // after the forward. Empty: the tensor must be kept.
  std::function<Tensor()> recompute;
};

// The edge through which gradient flows into t: grad_fn for results, the accumulator for
// leaves that require grad, an invalid edge otherwise.
Edge gradient_edge(const Tensor& t);

}  // namespace dpar::autograd
