#pragma once
// Recording ops in the graph. An op computes its outputs without autograd, then, if
// needs_grad(inputs), records a node with a backward function:
//
//   Tensor y = ...forward...;
//   if (autograd::needs_grad({x, w})) {
//     autograd::record("conv2d", {x, w}, {y},
//         [xs = x.detach(), ws = w.detach()](const GradList& g, const NeedsGrad& need) {
//           return GradList{need[0] ? dx(...) : Tensor(), need[1] ? dw(...) : Tensor()};
//         });
//   }
//
// Rules: capture detached tensors only (x.detach()) - capturing an output that points back
// at the node would create a reference cycle; return one gradient per input, in order, with
// the input's shape; return an undefined Tensor where need[i] is false.
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "dpar/autograd/node.h"

namespace dpar::autograd {

using GradList = std::vector<Tensor>;
using NeedsGrad = std::vector<bool>;
using BackwardFn = std::function<GradList(const GradList& grad_outputs, const NeedsGrad& need)>;

// True when grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Inside a backward function: the running sum the engine already holds for input `input`'s
// gradient (another path into that input, e.g. a residual connection, delivered first), when no
// other tensor can see it - else undefined. A backward may add its gradient for that input into
// it and return that same tensor: the sum is then complete without a pass of its own. It must
// add exactly its gradient (sum + g, as the engine would) and return the target itself; adding
// into it and returning anything else would count the gradient twice.
Tensor accumulation_target(size_t input);

// Records outputs = op(inputs) with the given backward. Outputs become non-leaf tensors that
// require grad. Undefined inputs (e.g. an absent bias) are allowed and get invalid edges.
void record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward);

// A tensor a backward function reads. Where the tensor can be made again from what other
// backward functions keep anyway (its producer attached a recipe: set_recompute), and
// recomputation is on, only the recipe is kept, so the activation itself is freed after the
// forward and made again, the same bits, when the backward runs. Else the detached tensor is
// kept, as capturing x.detach() does.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  bool defined() const { return tensor_.defined() || static_cast<bool>(recompute_); }
  const Shape& shape() const { return shape_; }
  bool recomputed() const { return static_cast<bool>(recompute_); }
  // The tensor (made again where only its recipe was kept).
  Tensor get() const;

 private:
  Tensor tensor_;
  std::function<Tensor()> recompute_;
  Shape shape_;
};

// Attaches to t (a result that requires grad) the recipe that makes its values again; the recipe
// must capture only detached tensors that the graph keeps anyway, and give the same bits.
void set_recompute(const Tensor& t, std::function<Tensor()> recipe);
// t's recipe when it has one and recomputation is on, else empty.
std::function<Tensor()> recompute_of(const Tensor& t);
// An in-place write to t (copy_, fill_, add_, mul_) drops its recipe: an op that reads t later
// must keep the written values, not remake the old ones. (Ops that saved the recipe before the
// write still remake what they read.)
void drop_recompute(const Tensor& t);

// Recomputation of activations in backward (on by default; DPAR_RECOMPUTE=0 turns it off for the
// process): trades a pass over each recomputed activation for its memory.
bool recompute_enabled();
void set_recompute_enabled(bool on);

}  // namespace dpar::autograd
