// dpar::torch::DataParallel's optimizer connection: the tensors a libtorch optimizer updates
// (whole parameters, or this rank's bucket slices with sharding), the all-gather after its
// step, gradient clipping by the global norm, memory, and optimizer shard sets.
//
// Sharded, the Reducer moves every parameter's data into its bucket's flat buffer (set_data:
// the module's, autograd's and any optimizer's handles stay valid) and the binding offers one
// libtorch leaf per bucket over this rank's slice. The gather after each step waits for its
// collectives (overlap = false): libtorch reads parameter memory without asking dpar, so the
// per-bucket gate that lets dpar's own forward overlap the gather cannot hold a libtorch
// forward back.
#include <algorithm>

#include "autograd_binding.h"
#include "dpar/distributed/optimizer_shards.h"
#include "dpar/optim/clip_grad.h"
#include "optimizer_state.h"

namespace dpar::torch {
namespace {

const char* kWho = "dpar::torch::DataParallel";

}  // namespace

std::vector<at::Tensor> DataParallelBase::optimizer_parameters() const {
  if (sharded()) return impl_->binding->slices();
  std::vector<at::Tensor> out;
  for (auto& [name, p] : internal::trainable_parameters(*module_)) out.push_back(p);
  return out;
}

std::function<void()> DataParallelBase::attach_optimizer(
    const std::shared_ptr<::torch::optim::Optimizer>& optimizer) {
  std::erase_if(impl_->optimizers, [](const auto& weak) { return weak.expired(); });
  impl_->optimizers.push_back(optimizer);
  if (!sharded()) return {};
  DPAR_CHECK(optimizer->param_groups().size() == 1, kWho,
             ": a sharded optimizer has one parameter group (this rank's slices)");
  std::weak_ptr<dist::Reducer> reducer = impl_->reducer;
  return [reducer] {
    if (auto r = reducer.lock()) r->gather_parameters(/*overlap=*/false);
  };
}

void DataParallelBase::check_optimizer_attached() const {
  if (!sharded() || !impl_->reducer->layout_final() || !sync_enabled_) return;
  const bool any = std::any_of(impl_->optimizers.begin(), impl_->optimizers.end(),
                               [](const auto& weak) { return !weak.expired(); });
  DPAR_CHECK(any, kWho, "(shard = ", dist::shard_mode_name(options_.shard),
             "): no optimizer was made by ddp.make_optimizer<Opt>(options), so the updated "
             "parameter slices are never gathered and the ranks' models drift apart");
}

void DataParallelBase::follow_relayout() {
  const std::vector<at::Tensor>& slices = impl_->binding->slices();
  for (const auto& weak : impl_->optimizers) {
    // The lock keeps the layout while any optimizer has state: these have none.
    if (auto opt = weak.lock()) opt->param_groups().front().params() = slices;
  }
}

double DataParallelBase::clip_grad_norm(double max_norm) {
  std::vector<Tensor> grads;
  for (const at::Tensor& p : optimizer_parameters()) {
    if (p.grad().defined()) grads.push_back(to_dpar(p.grad()));
  }
  optim::Optimizer::CrossShardSum sum_over_ranks;
  if (sharded()) {
    std::shared_ptr<dist::Group> group = options_.group;
    sum_over_ranks = [group](Tensor& t) {
      group->allreduce({t}, dist::ReduceOp::Sum, /*async_op=*/false);
    };
  }
  return optim::clip_gradients_by_norm(grads, max_norm, sum_over_ranks);
}

dist::ShardMemory DataParallelBase::memory_stats() const {
  dist::ShardMemory m;
  for (const auto& [name, p] : internal::trainable_parameters(*module_)) {
    m.parameters += p.nbytes();
    if (!impl_->reducer && p.grad().defined()) m.gradients += p.grad().nbytes();
  }
  if (impl_->reducer) m.gradients = impl_->reducer->gradient_bytes();
  for (const auto& weak : impl_->optimizers) {
    if (auto opt = weak.lock()) m.optimizer_state += internal::state_bytes_of(*opt);
  }
  return m;
}

bool DataParallelBase::sharded() const { return impl_->reducer && impl_->reducer->sharded(); }

dist::OptimizerLayout DataParallelBase::optimizer_layout() const {
  if (sharded()) return impl_->reducer->shard_layout();
  nn::NamedTensors params;
  for (auto& [name, p] : internal::trainable_parameters(*module_))
    params.emplace_back(name, to_dpar(p));
  return dist::whole_parameter_layout(params);
}

void DataParallelBase::save_optimizer_state(const ::torch::optim::Optimizer& optimizer,
                                            const std::string& dir) const {
  const bool pending = impl_->pending_optimizer.get() == &optimizer;
  const dist::OptimizerLayout layout = optimizer_layout();
  // A state loaded but not applied yet is what this optimizer holds (see load_optimizer_state).
  const optim::StateDict state =
      pending ? dist::read_optimizer_shards(impl_->pending_dir, layout,
                                            internal::optimizer_kind(optimizer))
              : internal::state_dict_of(optimizer);
  dist::save_optimizer_shards(dir, layout, state, internal::optimizer_kind(optimizer),
                              impl_->reducer ? options_.group.get() : nullptr);
}

void DataParallelBase::load_optimizer_state(
    const std::shared_ptr<::torch::optim::Optimizer>& optimizer, const std::string& dir) {
  DPAR_CHECK(optimizer != nullptr, kWho, "::load_optimizer_state: no optimizer");
  if (sharded() && !impl_->reducer->layout_final()) {
    impl_->pending_optimizer = optimizer;
    impl_->pending_dir = dir;
    return;
  }
  apply_optimizer_state(*optimizer, dir);
}

void DataParallelBase::apply_optimizer_state(::torch::optim::Optimizer& optimizer,
                                             const std::string& dir) {
  std::string error;
  try {
    internal::load_state_dict_into(
        optimizer,
        dist::read_optimizer_shards(dir, optimizer_layout(), internal::optimizer_kind(optimizer)));
  } catch (const std::exception& e) {
    error = e.what();
  }
  dist::fail_together(impl_->reducer ? options_.group.get() : nullptr, error,
                      "dpar::torch::DataParallel: another rank failed to load its optimizer state "
                      "(its log names the problem)");
}

}  // namespace dpar::torch
