#include "dpar/autograd/engine.h"

#include <optional>
#include <queue>
#include <unordered_map>

#include "dpar/autograd/grad_mode.h"
#include "dpar/autograd/node.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"

namespace dpar::autograd {
namespace {

struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

// Whether slot's memory belongs to slot alone: dpar allocated it, and no other tensor or view
// shares its impl or its storage (a backward that hands one gradient to two inputs, a hook, a
// retained grad, a slice of a larger gradient, a caller's own gradient tensor all hold a
// second reference), so adding into it changes nothing anyone else can see. Dense in any
// layout: a CNN's gradients are channels-last.
bool owned_alone(const Tensor& slot) {
  return slot.defined() && slot.impl_ptr().use_count() == 1 && slot.storage().use_count() == 1 &&
         slot.storage()->from_allocator() && !slot.storage()->has_pending_write() &&
         slot.dtype() == DType::f32 && slot.is_dense();
}
// ... and g adds into it in one flat pass (or slot is contiguous, as before).
bool owned_alone(const Tensor& slot, const Tensor& g) {
  return owned_alone(slot) && g.dtype() == DType::f32 && slot.shape() == g.shape() &&
         slot.device() == g.device() && (slot.is_contiguous() || slot.strides() == g.strides());
}

// Adds g into slot: in place when slot's memory is its own (a residual connection's two
// gradients then cost one pass and no new buffer), else out of place. Either way the sum is
// slot + g, so the bits do not depend on which.
void accumulate(Tensor& slot, Tensor g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = std::move(g);
  } else if (owned_alone(slot, g)) {
    add_(slot, g);
  } else {
    slot = add(slot, g);
  }
}

// Callbacks queued by queue_callback() during the running backward pass on this thread.
thread_local std::vector<std::function<void()>>* pending_callbacks = nullptr;

// accumulation_target()'s answers for the node whose backward runs on this thread.
thread_local const std::vector<Tensor>* current_targets = nullptr;

// Sets current_targets for one backward call.
class TargetsScope {
 public:
  explicit TargetsScope(const std::vector<Tensor>* targets) { current_targets = targets; }
  ~TargetsScope() { current_targets = nullptr; }
  TargetsScope(const TargetsScope&) = delete;
  TargetsScope& operator=(const TargetsScope&) = delete;
};

}  // namespace

void queue_callback(std::function<void()> fn) {
  DPAR_CHECK(pending_callbacks != nullptr,
             "autograd::queue_callback: called outside a backward pass");
  pending_callbacks->push_back(std::move(fn));
}

bool in_backward() { return pending_callbacks != nullptr; }

Tensor accumulation_target(size_t input) {
  if (current_targets == nullptr || input >= current_targets->size()) return {};
  return (*current_targets)[input];
}

void zero_grad(const std::vector<Tensor>& tensors, bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& t : tensors) {
    Tensor g = t.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      Tensor(t).set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph) {
  DPAR_CHECK(roots.size() == grad_roots.size(), "backward: ", roots.size(), " roots but ",
             grad_roots.size(), " gradients");
  NoGradGuard no_grad;  // backward functions compute with plain tensors
  DPAR_CHECK(pending_callbacks == nullptr,
             "backward: called from inside another backward pass on the same thread");
  std::vector<std::function<void()>> callbacks;
  pending_callbacks = &callbacks;
  struct ResetCallbacks {
    ~ResetCallbacks() { pending_callbacks = nullptr; }
  } reset_callbacks;

  // 1. Root edges and their gradients.
  std::vector<std::pair<Edge, Tensor>> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    DPAR_CHECK(root.defined(), "backward: root tensor is undefined");
    Edge e = gradient_edge(root);
    DPAR_CHECK(e.valid(), "backward: the tensor ", root.str(),
               " does not require grad and has no grad_fn");
    Tensor g = grad_roots[i];
    if (!g.defined()) {
      DPAR_CHECK(root.numel() == 1,
                 "backward: a gradient can be implied only for one-element "
                 "outputs; pass one for ",
                 root.str());
      g = Tensor::ones(root.shape(), root.dtype(), root.device());
    }
    DPAR_CHECK(g.shape() == root.shape(), "backward: gradient shape ", g.shape(),
               " does not match output shape ", root.shape());
    starts.emplace_back(std::move(e), std::move(g));
  }

  // 2. Count, for every reachable node, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& [e, g] : starts) {
    if (!seen[e.node.get()]) {
      seen[e.node.get()] = true;
      stack.push_back(e.node.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++dependencies[e.node.get()];
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }

  // 3. Run nodes as they become ready, latest first.
  std::unordered_map<Node*, std::vector<Tensor>> inputs;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  auto slot_for = [&](const Edge& e) -> Tensor& {
    auto& buffer = inputs[e.node.get()];
    if (buffer.empty()) buffer.resize(e.node->outputs().size());
    return buffer[e.input_nr];
  };
  for (auto& [e, g] : starts) {
    accumulate(slot_for(e), g);
    keep_alive[e.node.get()] = e.node;
  }
  for (auto& [e, g] : starts) {
    if (dependencies[e.node.get()] == 0 && keep_alive.count(e.node.get())) {
      ready.push(e.node.get());
      dependencies[e.node.get()] = -1;  // queued
    }
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(inputs[node]);
    inputs.erase(node);
    grads.resize(node->outputs().size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) {
        const OutputMeta& m = node->outputs()[i];
        grads[i] = Tensor::zeros(m.shape, m.dtype, m.device);
      }
    }
    const auto& edges = node->next_edges();
    // The sums already held for this node's inputs that only the engine sees: the backward may
    // add into them (accumulation_target). A second edge to the same slot finds it shared.
    std::vector<Tensor> targets(edges.size());
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].valid()) continue;
      auto held = inputs.find(edges[i].node.get());
      if (held == inputs.end() || held->second.size() <= edges[i].input_nr) continue;
      const Tensor& sum = held->second[edges[i].input_nr];
      if (owned_alone(sum)) targets[i] = sum;
    }
    std::vector<Tensor> results;
    {
      std::optional<profiler::Scope> timed;
      if (profiler::enabled()) timed.emplace(node->name() + "_backward");
      TargetsScope scope(&targets);
      results = node->apply(std::move(grads));
    }
    if (!retain_graph) node->release_saved();
    DPAR_CHECK(results.size() == edges.size() || edges.empty(), "backward of ", node->name(),
               " returned ", results.size(), " gradients for ", edges.size(), " inputs");
    // A result that is its target already holds the sum; drop the extra references first, so
    // the in-place adds below still find their slots owned alone.
    for (size_t i = 0; i < targets.size() && i < results.size(); ++i) {
      if (targets[i].defined() && results[i].defined() &&
          results[i].impl_ptr() == targets[i].impl_ptr()) {
        results[i] = Tensor();
      }
    }
    targets.clear();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      if (results[i].defined()) {
        DPAR_CHECK(results[i].shape() == e.node->outputs()[e.input_nr].shape, "backward of ",
                   node->name(), " returned a gradient of shape ", results[i].shape(),
                   " for input ", i, " of shape ", e.node->outputs()[e.input_nr].shape);
        accumulate(slot_for(e), std::move(results[i]));
      }
      keep_alive[e.node.get()] = e.node;
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
    keep_alive.erase(node);
  }

  // Final callbacks run after every node; one may queue another (drained in order).
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> fn = std::move(callbacks[i]);
    fn();
  }
}

}  // namespace dpar::autograd
