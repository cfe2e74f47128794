#include "dpar/autograd/function.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/error.h"

namespace dpar::autograd {
namespace {

// A node whose backward is a function object; the object (and the tensors it captured) is
// dropped after it runs unless the graph is retained.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn, NeedsGrad needs)
      : name_(std::move(name)), fn_(std::move(fn)), needs_(std::move(needs)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    DPAR_CHECK(fn_ != nullptr, "backward through ", name_,
               " a second time: its saved tensors were freed; pass retain_graph=true to the "
               "first backward");
    return fn_(grads, needs_);
  }
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
  NeedsGrad needs_;
};

std::atomic<bool>& recompute_switch() {
  static std::atomic<bool> on{[] {
    const char* text = std::getenv("DPAR_RECOMPUTE");
    if (text == nullptr || *text == '\0') return true;
    DPAR_CHECK(std::strcmp(text, "0") == 0 || std::strcmp(text, "1") == 0,
               "DPAR_RECOMPUTE: expected 1 or 0, got '", text, "'");
    return std::strcmp(text, "1") == 0;
  }()};
  return on;
}

}  // namespace

bool recompute_enabled() { return recompute_switch().load(std::memory_order_relaxed); }
void set_recompute_enabled(bool on) { recompute_switch().store(on); }

void set_recompute(const Tensor& t, std::function<Tensor()> recipe) {
  TensorImpl* impl = t.impl();
  DPAR_CHECK(impl != nullptr && impl->autograd != nullptr,
             "set_recompute: the tensor is not a recorded result");
  impl->autograd->recompute = std::move(recipe);
}

std::function<Tensor()> recompute_of(const Tensor& t) {
  if (!t.defined() || t.impl()->autograd == nullptr || !recompute_enabled()) return {};
  return t.impl()->autograd->recompute;
}

void drop_recompute(const Tensor& t) {
  if (t.defined() && t.impl()->autograd != nullptr) t.impl()->autograd->recompute = nullptr;
}

SavedTensor::SavedTensor(const Tensor& t) : shape_(t.defined() ? t.shape() : Shape{}) {
  if (!t.defined()) return;
  recompute_ = recompute_of(t);
  if (!recompute_) tensor_ = t.detach();
}

Tensor SavedTensor::get() const { return recompute_ ? recompute_() : tensor_; }

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  return needs_grad(std::vector<Tensor>(inputs));
}

void record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward) {
  NeedsGrad needs;
  std::vector<Edge> edges;
  for (const Tensor& in : inputs) {
    Edge e = gradient_edge(in);
    needs.push_back(e.valid());
    edges.push_back(std::move(e));
  }
  auto node =
      std::make_shared<FunctionNode>(std::move(name), std::move(backward), std::move(needs));
  node->mutable_next_edges() = std::move(edges);
  uint32_t nr = 0;
  for (const Tensor& out : outputs) {
    node->mutable_outputs().push_back({out.shape(), out.dtype(), out.device()});
    TensorImpl* impl = out.impl();
    if (!impl->autograd) impl->autograd = std::make_unique<AutogradMeta>();
    impl->autograd->requires_grad = true;
    impl->autograd->grad_fn = node;
    impl->autograd->output_nr = nr++;
  }
}

}  // namespace dpar::autograd
