// DataParallel's optimizer connection: the tensors an optimizer updates (whole parameters, or
// this rank's slices with sharding), the step hook that gathers updated slices, and the memory
// a rank holds.
#include <algorithm>

#include "dpar/autograd/engine.h"
#include "dpar/distributed/data_parallel.h"
#include "reducer.h"

namespace dpar::dist {
namespace {

std::string who(ShardMode mode) {
  return ::dpar::detail::str_cat("DataParallel(shard = ", shard_mode_name(mode), ")");
}

}  // namespace

std::vector<Tensor> DataParallel::optimizer_parameters() const {
  if (!reducer_ || !reducer_->sharded()) return parameters();
  return reducer_->shard_parameters();
}

void DataParallel::attach_optimizer(const std::shared_ptr<optim::Optimizer>& optimizer) {
  DPAR_CHECK(optimizer != nullptr, "DataParallel::attach_optimizer: the optimizer is null");
  for (const auto& weak : optimizers_) {
    DPAR_CHECK(weak.lock() != optimizer,
               "DataParallel::attach_optimizer: this optimizer is attached already");
  }
  if (reducer_ && reducer_->sharded()) {
    const std::vector<Tensor> slices = reducer_->shard_parameters();
    const auto& params = optimizer->params();
    const bool same = params.size() == slices.size() &&
                      std::equal(params.begin(), params.end(), slices.begin(),
                                 [](const Tensor& a, const Tensor& b) { return a.is_same(b); });
    DPAR_CHECK(same, who(options_.shard), ": the ", optimizer->name(),
               " optimizer must be built from dp.optimizer_parameters() (this rank's ",
               slices.size(), " slices), not from the model's parameters; dp.make_optimizer<",
               optimizer->name(), ">(options) does both");
    std::weak_ptr<Reducer> reducer = reducer_;
    const bool overlap = options_.overlap_gather;
    optimizer->add_step_hook([reducer, overlap] {
      if (auto r = reducer.lock()) r->gather_parameters(overlap);
    });
    std::shared_ptr<Group> group = options_.group;
    optimizer->set_cross_shard_sum(
        [group](Tensor& t) { group->allreduce({t}, ReduceOp::Sum, /*async_op=*/false); });
  }
  std::erase_if(optimizers_, [](const auto& weak) { return weak.expired(); });
  optimizers_.push_back(optimizer);
}

void DataParallel::check_optimizer_attached() const {
  if (!reducer_ || !reducer_->sharded() || !reducer_->layout_final() || !sync_enabled_) return;
  const bool any = std::any_of(optimizers_.begin(), optimizers_.end(),
                               [](const auto& weak) { return !weak.expired(); });
  DPAR_CHECK(any, who(options_.shard),
             ": no optimizer is attached, so the updated parameter slices are never gathered "
             "and the ranks' models drift apart; build the optimizer with "
             "dp.make_optimizer<Opt>(options), or from dp.optimizer_parameters() followed by "
             "dp.attach_optimizer(opt)");
}

void DataParallel::follow_relayout() {
  const std::vector<Tensor> slices = reducer_->shard_parameters();
  for (const auto& weak : optimizers_) {
    if (auto opt = weak.lock()) opt->replace_parameters(slices);
  }
}

ShardMemory DataParallel::memory_stats() const {
  ShardMemory m;
  for (const Tensor& p : parameters()) m.parameters += p.nbytes();
  if (reducer_) {
    m.gradients = reducer_->gradient_bytes();
  } else {
    for (const Tensor& p : parameters()) {
      if (p.grad().defined()) m.gradients += p.grad().nbytes();
    }
  }
  for (const auto& weak : optimizers_) {
    if (auto opt = weak.lock()) m.optimizer_state += opt->state_bytes();
  }
  return m;
}

void DataParallel::zero_grad(bool set_to_none) {
  Module::zero_grad(set_to_none);
  if (reducer_ && reducer_->sharded()) {
    autograd::zero_grad(reducer_->shard_parameters(), set_to_none);
  }
}

OptimizerLayout DataParallel::optimizer_layout() const {
  if (reducer_ && reducer_->sharded()) return reducer_->shard_layout();
  return whole_parameter_layout(named_parameters());
}

void DataParallel::load_optimizer_state(const std::shared_ptr<optim::Optimizer>& optimizer,
                                        OptimizerStateSource source) {
  DPAR_CHECK(optimizer != nullptr && source, "DataParallel::load_optimizer_state: no optimizer");
  if (reducer_ && reducer_->sharded() && !reducer_->layout_final()) {
    pending_optimizer_ = optimizer;
    pending_source_ = std::move(source);
    return;
  }
  apply_optimizer_state(*optimizer, source);
}

void DataParallel::apply_optimizer_state(optim::Optimizer& optimizer,
                                         const OptimizerStateSource& source) {
  std::string error;
  try {
    optimizer.load_state_dict(source(optimizer_layout()));
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_together(options_.group.get(), error,
                "DataParallel: another rank failed to load its optimizer state (its log names "
                "the problem)");
}

void fail_together(Group* group, const std::string& error, const std::string& other_failed) {
  if (!group || group->size() == 1) {
    DPAR_CHECK(error.empty(), error);
    return;
  }
  Tensor ok = Tensor::full({1}, error.empty() ? 1.0 : 0.0);
  group->allreduce({ok}, ReduceOp::Min, /*async_op=*/false);
  DPAR_CHECK(error.empty(), error);
  DPAR_CHECK(ok.item() == 1.0, other_failed);
}

void DataParallel::save_optimizer_state(const optim::Optimizer& optimizer,
                                        const std::string& dir) const {
  // A state loaded but not applied yet (the layout becomes final at the first backward) is
  // what this optimizer holds: it is saved, not the empty state it has until then.
  const bool pending = pending_optimizer_.get() == &optimizer;
  const OptimizerLayout layout = optimizer_layout();
  save_optimizer_shards(dir, layout, pending ? pending_source_(layout) : optimizer.state_dict(),
                        optimizer.name(), options_.group.get());
}

}  // namespace dpar::dist
