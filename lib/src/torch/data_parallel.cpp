#include "dpar/torch/data_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdio>
#include <unordered_set>

#include "distributed/model_check.h"
#include "distributed/reducer.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/torch/tensor.h"

namespace dpar::torch {
namespace {

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
    params_[i].mutable_grad() = to_torch(view);
  }
  void at_end_of_backward(std::function<void()> callback) override {
    ::torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
  }
  bool grad_enabled() const override { return at::GradMode::is_enabled(); }

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
  std::vector<std::shared_ptr<Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

dist::ModelSignature signature_of(const ::torch::nn::Module& m) {
  dist::ModelSignature s;
  for (const auto& item : m.named_parameters()) {
    const at::Tensor& t = item.value();
    s.params.push_back(dist::describe_model_entry(item.key(), c10::toString(t.scalar_type()),
                                                  t.sizes().vec(), !t.requires_grad()));
  }
  for (const auto& item : m.named_buffers()) {
    const at::Tensor& t = item.value();
    s.buffers.push_back(dist::describe_model_entry(item.key(), c10::toString(t.scalar_type()),
                                                   t.sizes().vec(), false));
  }
  return s;
}

// A broadcast moves bits, so every dense tensor goes as its bytes (int32 or double buffers
// too, which dpar has no dtype for).
Tensor bytes_of(const at::Tensor& t, const std::string& name) {
  DPAR_CHECK(t.is_contiguous(), "dpar::torch::DataParallel: '", name,
             "' is not contiguous, so it cannot be broadcast in place");
  return to_dpar(t.view({-1}).view(c10::ScalarType::Byte));
}

std::vector<Tensor> state_bytes(const ::torch::nn::Module& m, bool parameters) {
  std::vector<Tensor> out;
  if (parameters) {
    for (const auto& item : m.named_parameters()) out.push_back(bytes_of(item.value(), item.key()));
  }
  for (const auto& item : m.named_buffers()) out.push_back(bytes_of(item.value(), item.key()));
  return out;
}

}  // namespace

class DataParallelBase::Impl {
 public:
  std::vector<at::Tensor> params;           // trainable, each once, registration order
  TorchAutogradBinding* binding = nullptr;  // owned by the reducer
  std::unique_ptr<dist::Reducer> reducer;
};

DataParallelBase::DataParallelBase(std::shared_ptr<::torch::nn::Module> module,
                                   DataParallelOptions options)
    : module_(std::move(module)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  DPAR_CHECK(module_ != nullptr, "dpar::torch::DataParallel: the module is null");
  const dist::Reducer::Options reducer_options =
      dist::Reducer::options_from(options_, "dpar::torch::DataParallel");
  // Sharding re-points parameters into flat buffers, which libtorch's tensors cannot follow
  // yet (docs/sharding.md).
  DPAR_CHECK(options_.shard == dist::ShardMode::none,
             "dpar::torch::DataParallel: shard = ", dist::shard_mode_name(options_.shard),
             " is not supported for libtorch modules yet; use shard = none (or dpar's own "
             "dist::DataParallel)");
  if (!options_.group) {
    dist::require_init_under_launcher("dpar::torch::DataParallel");
    options_.group = dist::default_group_ptr();
  }
  if (!options_.group || options_.group->size() == 1) return;
  dist::Group& group = *options_.group;
  try {
    dist::verify_same_model(group, signature_of(*module_));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.rfind("DataParallel: ", 0) == 0) throw;  // the mismatch itself
    DPAR_FAIL(
        "dpar::torch::DataParallel's model check at construction (every rank must build its "
        "DataParallel): ",
        what);
  }
  {
    at::NoGradGuard no_grad;
    dist::broadcast_coalesced(group, state_bytes(*module_, /*parameters=*/true), 0,
                              "DataParallel's broadcast of rank 0's parameters and buffers at "
                              "construction (every rank must build its DataParallel)");
  }

  nn::NamedTensors trainable;
  std::unordered_set<const void*> seen;  // tied weights: one gradient, the first name
  for (const auto& item : module_->named_parameters()) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    trainable.emplace_back(item.key(), to_dpar(p));
    impl_->params.push_back(p);
  }
  auto binding = std::make_unique<TorchAutogradBinding>(impl_->params);
  impl_->binding = binding.get();
  impl_->reducer = std::make_unique<dist::Reducer>(std::move(trainable), std::move(binding),
                                                   options_.group, reducer_options);
  if (group.rank() == 0) {
    std::printf("DataParallel: %s\n", bucket_summary().c_str());
    std::fflush(stdout);
  }
}

DataParallelBase::~DataParallelBase() = default;

void DataParallelBase::before_forward(int64_t local_batch) {
  if (!impl_->reducer) return;
  // Rank 0's BN running statistics are the truth (DDP's broadcast_buffers); see
  // dpar::dist::DataParallel::run_forward for when they travel.
  const bool training = module_->is_training();
  if (options_.broadcast_buffers && (training || !buffers_in_sync_)) {
    std::vector<Tensor> buffers = state_bytes(*module_, /*parameters=*/false);
    if (!buffers.empty()) {
      at::NoGradGuard no_grad;
      dist::broadcast_coalesced(*options_.group, buffers, 0,
                                "DataParallel's buffer broadcast before a forward (every rank "
                                "must run it; evaluate ddp.module() on one rank, or set "
                                "broadcast_buffers = false)");
    }
  }
  buffers_in_sync_ = !training;
  impl_->reducer->prepare_forward(sync_enabled_, local_batch);
}

void DataParallelBase::after_forward(const std::vector<at::Tensor>& outputs) {
  if (!impl_->reducer) return;
  impl_->reducer->after_forward([&] { return impl_->binding->reachable_from(outputs); });
}

std::vector<BucketInfo> DataParallelBase::buckets() const {
  return impl_->reducer ? impl_->reducer->buckets() : std::vector<BucketInfo>{};
}

std::string DataParallelBase::bucket_summary() const {
  if (!impl_->reducer) return "all_reduce tensors: 0 (a world of one: nothing to synchronise)";
  return dist::format_bucket_summary(impl_->reducer->buckets());
}

dist::DataParallel::CommStats DataParallelBase::last_comm_stats() const {
  return impl_->reducer ? impl_->reducer->last_comm_stats() : dist::DataParallel::CommStats{};
}

DataParallelBase::NoSyncGuard::NoSyncGuard(DataParallelBase& dp)
    : dp_(dp), previous_(dp.sync_enabled_) {
  dp_.sync_enabled_ = false;
}

DataParallelBase::NoSyncGuard::~NoSyncGuard() { dp_.sync_enabled_ = previous_; }

}  // namespace dpar::torch
