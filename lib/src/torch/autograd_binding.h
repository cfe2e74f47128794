#pragma once
// dpar::torch::DataParallel's internals shared by its source files: libtorch's autograd as the
// Reducer sees it, and the state behind DataParallelBase.
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "distributed/reducer.h"
#include "dpar/torch/data_parallel.h"
#include "dpar/torch/tensor.h"

namespace dpar::torch::internal {

using ::torch::autograd::Node;
using ::torch::autograd::variable_list;

// Runs on_ready(index) after libtorch's AccumulateGrad has written a parameter's gradient
// (DDP hooks the same place: a tensor hook would run before accumulation).
class GradReadyHook : public ::torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::function<void(size_t)> on_ready, size_t index)
      : on_ready_(std::move(on_ready)), index_(index) {}
  variable_list operator()(const variable_list& outputs, const variable_list&) override {
    on_ready_(index_);
    return outputs;
  }

 private:
  std::function<void(size_t)> on_ready_;
  size_t index_;
};

// libtorch's autograd as the Reducer sees it: gradients are dpar views of .grad(), and a
// bucket view becomes .grad() through to_torch (the same memory).
class TorchAutogradBinding : public dist::AutogradBinding {
 public:
  explicit TorchAutogradBinding(std::vector<at::Tensor> params) : params_(std::move(params)) {
    // The accumulators live as long as something holds them: keep them, or a hook installed
    // now would vanish with a node libtorch re-creates later.
    for (const auto& p : params_) {
      accumulators_.push_back(::torch::autograd::impl::grad_accumulator(p));
    }
  }
  void install_hooks(std::function<void(size_t)> on_ready) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      keys_.push_back(
          accumulators_[i]->add_post_hook(std::make_unique<GradReadyHook>(on_ready, i)));
    }
  }
  void remove_hooks() override {
    for (size_t i = 0; i < keys_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
    keys_.clear();
  }
  Tensor grad(size_t i) const override {
    const at::Tensor& g = params_[i].grad();
    return g.defined() ? to_dpar(g) : Tensor();
  }
  bool grad_is(size_t i, const Tensor& view) const override {
    const at::Tensor& g = params_[i].grad();
    return g.defined() && g.data_ptr() == view.raw_data() &&
           g.sizes() == c10::IntArrayRef(view.shape()) &&
           g.strides() == c10::IntArrayRef(view.strides());
  }
  void set_grad(size_t i, const Tensor& view) override {
    params_[i].mutable_grad() = view.defined() ? to_torch(view) : at::Tensor();
  }
  void at_end_of_backward(std::function<void()> callback) override {
    ::torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
  }
  bool grad_enabled() const override { return at::GradMode::is_enabled(); }

  // Sharding: the parameter's data moves into its bucket's flat buffer; the parameter stays
  // the same libtorch tensor (module, optimizer and autograd keep their handles).
  void relocate(size_t i, const Tensor& home) override {
    at::NoGradGuard no_grad;
    params_[i].set_data(to_torch(home));
  }
  // Libtorch leaves over the slices, with the slices' gradients: what a libtorch optimizer
  // built from DataParallel::optimizer_parameters() updates.
  void set_slices(const std::vector<Tensor>& slices) override {
    slices_.clear();
    for (const Tensor& slice : slices) {
      at::Tensor leaf = to_torch(slice);
      leaf.set_requires_grad(true);
      leaf.mutable_grad() = to_torch(slice.grad());
      slices_.push_back(leaf);
    }
  }
  Tensor slice_grad(size_t k) const override {
    const at::Tensor& g = slices_[k].grad();
    return g.defined() ? to_dpar(g) : Tensor();
  }
  void set_slice_grad(size_t k, const Tensor& grad) override {
    const at::Tensor& g = slices_[k].grad();
    if (g.defined() && g.data_ptr() == grad.raw_data() && g.numel() == grad.numel()) return;
    slices_[k].mutable_grad() = to_torch(grad);
  }
  const std::vector<at::Tensor>& slices() const { return slices_; }

  // Which parameters the outputs' autograd graphs reach (through their accumulators).
  std::vector<bool> reachable_from(const std::vector<at::Tensor>& outputs) const {
    std::vector<Node*> stack;
    std::unordered_set<Node*> seen;
    for (const auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      const auto edge = ::torch::autograd::impl::gradient_edge(out);
      if (edge.function && seen.insert(edge.function.get()).second) {
        stack.push_back(edge.function.get());
      }
    }
    if (stack.empty()) return {};
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const auto& e : node->next_edges()) {
        if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function.get());
      }
    }
    std::vector<bool> out(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) out[i] = seen.count(accumulators_[i].get()) > 0;
    return out;
  }

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> slices_;
  std::vector<std::shared_ptr<Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

// The module's trainable parameters, each once (tied weights: one gradient, the first name).
inline std::vector<std::pair<std::string, at::Tensor>> trainable_parameters(
    const ::torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& p = item.value();
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) {
      out.emplace_back(item.key(), p);
    }
  }
  return out;
}

}  // namespace dpar::torch::internal

namespace dpar::torch {

class DataParallelBase::Impl {
 public:
  std::vector<at::Tensor> params;                     // trainable, each once, registration order
  internal::TorchAutogradBinding* binding = nullptr;  // owned by the reducer
  std::shared_ptr<dist::Reducer> reducer;  // shared: optimizers' step functions hold it weakly
  // Optimizers made by make_optimizer(): they follow the layout, and their state locks it.
  std::vector<std::weak_ptr<::torch::optim::Optimizer>> optimizers;
  // A load_optimizer_state() waiting for the final layout.
  std::shared_ptr<::torch::optim::Optimizer> pending_optimizer;
  std::string pending_dir;
};

}  // namespace dpar::torch
