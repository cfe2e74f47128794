#include "dpar/distributed/data_parallel.h"

#include <cstdio>
#include <unordered_set>

#include "dpar/autograd/engine.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/autograd/node.h"
#include "dpar/distributed/parallel_env.h"
#include "model_check.h"
#include "reducer.h"

namespace dpar::dist {
namespace {

ModelSignature signature_of(const nn::Module& m) {
  ModelSignature s;
  for (const auto& [name, t] : m.named_parameters()) {
    s.params.push_back(describe_model_entry(name, std::string(dtype_name(t.dtype())), t.shape(),
                                            !t.requires_grad()));
  }
  for (const auto& [name, t] : m.named_buffers()) {
    s.buffers.push_back(
        describe_model_entry(name, std::string(dtype_name(t.dtype())), t.shape(), false));
  }
  return s;
}

// dpar's own autograd: gradient-ready hooks on the parameters, autograd::queue_callback.
class DparAutogradBinding : public AutogradBinding {
 public:
  explicit DparAutogradBinding(std::vector<Tensor> params) : params_(std::move(params)) {}
  void install_hooks(std::function<void(size_t)> on_ready) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      hooks_.push_back(
          params_[i].register_grad_ready_hook([on_ready, i](Tensor&) { on_ready(i); }));
    }
  }
  void remove_hooks() override {
    for (size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_grad_ready_hook(hooks_[i]);
    hooks_.clear();
  }
  Tensor grad(size_t i) const override { return params_[i].grad(); }
  bool grad_is(size_t i, const Tensor& view) const override {
    const Tensor g = params_[i].grad();
    return g.defined() && g.is_same(view);
  }
  void set_grad(size_t i, const Tensor& view) override { params_[i].set_grad(view); }
  void at_end_of_backward(std::function<void()> callback) override {
    autograd::queue_callback(std::move(callback));
  }
  bool grad_enabled() const override { return GradMode::is_enabled(); }
  // The Reducer's slices are the optimizer's tensors.
  void set_slices(const std::vector<Tensor>& slices) override { slices_ = slices; }
  Tensor slice_grad(size_t k) const override { return slices_[k].grad(); }
  void set_slice_grad(size_t k, const Tensor& grad) override { slices_[k].set_grad(grad); }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> slices_;
  std::vector<int> hooks_;
};

// The parameters (by position) that output's autograd graph reaches.
std::vector<bool> reachable_parameters(const Tensor& output, const std::vector<Tensor>& params) {
  autograd::Edge root = autograd::gradient_edge(output);
  if (!root.valid()) return {};
  std::unordered_set<const TensorImpl*> reached;
  std::vector<autograd::Node*> stack{root.node.get()};
  std::unordered_set<autograd::Node*> seen{root.node.get()};
  while (!stack.empty()) {
    autograd::Node* node = stack.back();
    stack.pop_back();
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(node)) {
      reached.insert(acc->variable().get());
    }
    for (const auto& e : node->next_edges()) {
      if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  std::vector<bool> out(params.size());
  for (size_t i = 0; i < params.size(); ++i) out[i] = reached.count(params[i].impl()) > 0;
  return out;
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options)
    : Module("DataParallel"), module_(std::move(module)), options_(std::move(options)) {
  DPAR_CHECK(module_ != nullptr, "DataParallel: the module is null");
  const Reducer::Options reducer_options = Reducer::options_from(options_, "DataParallel");
  // A child, so apply(), repr() and train() reach it; the overrides below drop the prefix.
  register_module("module", module_);
  Module::train(module_->is_training());
  if (!options_.group) {
    // Under a launcher (world size > 1 in the environment) a missing init_parallel_env() would
    // make every process train alone as rank 0 of 1: an error, as in PyTorch's DDP.
    require_init_under_launcher("DataParallel");
    options_.group = default_group_ptr();
  }
  // No group (a single process) or a world of one: nothing to synchronise, so a plain
  // wrapper whose gradients stay the module's own.
  if (!options_.group || options_.group->size() == 1) return;
  Group& group = *options_.group;

  try {
    verify_same_model(group, signature_of(*module_));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.rfind("DataParallel: ", 0) == 0) throw;  // the mismatch itself
    DPAR_FAIL(
        "DataParallel's model check at construction (every rank must build its "
        "DataParallel): ",
        what);
  }
  std::vector<Tensor> state = module_->parameters();
  for (auto& b : module_->buffers()) state.push_back(b);
  broadcast_coalesced(group, state, 0,
                      "DataParallel's broadcast of rank 0's parameters and buffers at "
                      "construction (every rank must build its DataParallel)");

  // A tensor registered twice (tied weights) has one gradient: it keeps its first name.
  nn::NamedTensors trainable;
  std::unordered_set<const TensorImpl*> seen;
  for (auto& [name, t] : module_->named_parameters()) {
    if (t.requires_grad() && seen.insert(t.impl()).second) trainable.emplace_back(name, t);
  }
  for (const auto& entry : trainable) trainable_params_.push_back(entry.second);
  reducer_ = std::make_shared<Reducer>(std::move(trainable),
                                       std::make_unique<DparAutogradBinding>(trainable_params_),
                                       options_.group, reducer_options);
  if (reducer_->sharded()) {
    reducer_->set_layout_final_callback([this](bool changed) {
      if (changed) follow_relayout();
      if (pending_optimizer_) {
        auto optimizer = std::move(pending_optimizer_);
        auto source = std::move(pending_source_);
        apply_optimizer_state(*optimizer, source);
      }
    });
    reducer_->set_layout_lock([this] {
      for (const auto& weak : optimizers_) {
        if (auto opt = weak.lock(); opt && opt->has_state()) return true;
      }
      return false;
    });
  }
  if (group.rank() == 0) {
    std::printf("DataParallel: %s\n", bucket_summary().c_str());
    std::fflush(stdout);
  }
}

DataParallel::~DataParallel() = default;

Tensor DataParallel::forward(const Tensor& input) { return run_forward(input, -1); }

Tensor DataParallel::forward(const Tensor& input, int64_t local_batch_size) {
  DPAR_CHECK(local_batch_size >= 0, "DataParallel::forward: local batch size must be >= 0, got ",
             local_batch_size);
  return run_forward(input, local_batch_size);
}

Tensor DataParallel::run_forward(const Tensor& input, int64_t local_batch_size) {
  // A training-mode forward updates BN running statistics from the rank's own batch, so they
  // drift apart; rank 0's are the truth, as in DDP. They go out before every training forward
  // and before the first eval forward after one (evaluation then uses the statistics rank 0
  // checkpoints); later eval forwards change nothing and communicate nothing.
  const bool training = module_->is_training();
  if (reducer_ && options_.broadcast_buffers && (training || !buffers_in_sync_)) {
    std::vector<Tensor> buffers = module_->buffers();
    if (!buffers.empty()) {
      broadcast_coalesced(*options_.group, buffers, 0,
                          "DataParallel's buffer broadcast before a forward (every rank must run "
                          "it; evaluate dp.module() on one rank, or set broadcast_buffers = "
                          "false)");
    }
  }
  buffers_in_sync_ = !training;
  check_optimizer_attached();
  if (reducer_) reducer_->prepare_forward(sync_enabled_, local_batch_size);
  Tensor output = module_->forward(input);
  if (reducer_) {
    reducer_->after_forward([&] { return reachable_parameters(output, trainable_params_); });
  }
  return output;
}

nn::NamedTensors DataParallel::named_parameters(bool recurse) const {
  return module_->named_parameters(recurse);
}
nn::NamedTensors DataParallel::named_buffers(bool recurse) const {
  return module_->named_buffers(recurse);
}
nn::NamedTensors DataParallel::state_dict() const { return module_->state_dict(); }
nn::LoadReport DataParallel::load_state_dict(const nn::NamedTensors& entries, bool strict) {
  return module_->load_state_dict(entries, strict);
}
nn::LoadReport DataParallel::compare_state_dict(const nn::NamedTensors& entries) const {
  return module_->compare_state_dict(entries);
}

std::vector<BucketInfo> DataParallel::buckets() const {
  return reducer_ ? reducer_->buckets() : std::vector<BucketInfo>{};
}

std::string DataParallel::bucket_summary() const {
  if (!reducer_) return "all_reduce tensors: 0 (a world of one: nothing to synchronise)";
  return format_bucket_summary(reducer_->buckets());
}

DataParallel::CommStats DataParallel::last_comm_stats() const {
  return reducer_ ? reducer_->last_comm_stats() : CommStats{};
}

DataParallel::NoSyncGuard::NoSyncGuard(DataParallel& dp) : dp_(dp), previous_(dp.sync_enabled_) {
  dp_.sync_enabled_ = false;
}

DataParallel::NoSyncGuard::~NoSyncGuard() { dp_.sync_enabled_ = previous_; }

}  // namespace dpar::dist
