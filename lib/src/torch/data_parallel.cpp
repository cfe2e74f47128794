#include "dpar/torch/data_parallel.h"

#include <cstdio>

#include "autograd_binding.h"
#include "distributed/model_check.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/torch/tensor.h"

namespace dpar::torch {
namespace {

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

DataParallelBase::DataParallelBase(std::shared_ptr<::torch::nn::Module> module,
                                   DataParallelOptions options)
    : module_(std::move(module)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  DPAR_CHECK(module_ != nullptr, "dpar::torch::DataParallel: the module is null");
  const dist::Reducer::Options reducer_options =
      dist::Reducer::options_from(options_, "dpar::torch::DataParallel");
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
  for (const auto& [name, p] : internal::trainable_parameters(*module_)) {
    trainable.emplace_back(name, to_dpar(p));
    impl_->params.push_back(p);
  }
  auto binding = std::make_unique<internal::TorchAutogradBinding>(impl_->params);
  impl_->binding = binding.get();
  impl_->reducer = std::make_shared<dist::Reducer>(std::move(trainable), std::move(binding),
                                                   options_.group, reducer_options);
  if (impl_->reducer->sharded()) {
    impl_->reducer->set_layout_final_callback([this](bool changed) {
      if (changed) follow_relayout();
      if (impl_->pending_optimizer) {
        auto optimizer = std::move(impl_->pending_optimizer);
        apply_optimizer_state(*optimizer, impl_->pending_dir);
      }
    });
    impl_->reducer->set_layout_lock([this] {
      for (const auto& weak : impl_->optimizers) {
        if (auto opt = weak.lock(); opt && !opt->state().empty()) return true;
      }
      return false;
    });
  }
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
  check_optimizer_attached();
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
