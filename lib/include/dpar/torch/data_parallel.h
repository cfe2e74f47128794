#pragma once
// dpar::torch::DataParallel: DistributedDataParallel for any torch::nn::Module, on dpar's
// process groups, started by dpar-launch like any dpar program.
//
//   dpar::dist::init_parallel_env();
//   auto model = std::make_shared<Net>();          // or a TORCH_MODULE holder
//   dpar::torch::DataParallel ddp(model);          // broadcasts rank 0's weights
//   auto loss = loss_fn(ddp.forward(x), y);        // or ddp(x)
//   loss.backward();                               // gradients averaged over ranks
//   optimizer.step();
//
// The semantics are dpar::dist::DataParallel's (and PyTorch DDP's):
//   * construction checks that every rank has the same parameter and buffer names, shapes and
//     dtypes (a mismatch names the first difference on every rank) and broadcasts rank 0's
//     parameters and buffers;
//   * each parameter's .grad() is a view of a fused bucket (first last_comm_buffer_size MB,
//     then comm_buffer_size MB), filled by libtorch's gradient accumulation in place; buckets
//     are rebuilt once, after the first backward, in the order gradients became ready;
//   * a post-hook on each parameter's gradient accumulator counts its bucket down, and a full
//     bucket's all-reduce starts at once on the group's communication thread, overlapping the
//     rest of backward; a callback at the end of backward waits for the rest;
//   * no_sync(), find_unused_parameters, comm_dtype bf16/f16, sample-weighted averages for
//     unequal local batches (forward_weighted), broadcast_buffers, the bucket summary and the
//     overlap statistics.
// A world of one (or a single process without init_parallel_env()) communicates nothing.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dpar/distributed/data_parallel.h"

namespace dpar::torch {

// The same options as dpar::dist::DataParallel (comm_buffer_size, last_comm_buffer_size,
// find_unused_parameters, broadcast_buffers, comm_dtype, group).
using DataParallelOptions = dist::DataParallelOptions;
using dist::BucketInfo;

// The untyped part: hooks, buckets and communication for one torch::nn::Module.
class DataParallelBase {
 public:
  DataParallelBase(std::shared_ptr<::torch::nn::Module> module, DataParallelOptions options);
  virtual ~DataParallelBase();
  DataParallelBase(const DataParallelBase&) = delete;
  DataParallelBase& operator=(const DataParallelBase&) = delete;

  // RAII scope in which backward accumulates gradients locally without communication; the
  // next synchronised backward reduces the accumulated sums. What counts is whether the
  // forward ran inside the scope (as in DDP).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallelBase& dp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DataParallelBase& dp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  std::vector<BucketInfo> buckets() const;
  // "all_reduce tensors: 62, after fusion: 3 buckets [1.0 MB, 25.0 MB, 18.7 MB]"
  std::string bucket_summary() const;
  dist::DataParallel::CommStats last_comm_stats() const;
  // The group gradients are averaged over (null: a single process).
  const std::shared_ptr<dist::Group>& group() const { return options_.group; }

 protected:
  // Around the wrapped module's forward. local_batch >= 0: sample-weighted averaging.
  void before_forward(int64_t local_batch);
  void after_forward(const std::vector<at::Tensor>& outputs);

  // The tensors of a forward's result (a tensor, a vector or tuple of tensors); anything
  // else contributes none (find_unused_parameters then relies on the end of backward).
  static void collect(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
  static void collect(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
    out.insert(out.end(), ts.begin(), ts.end());
  }
  template <typename... Ts>
  static void collect(const std::tuple<Ts...>& tuple, std::vector<at::Tensor>& out) {
    std::apply([&](const auto&... items) { (collect(items, out), ...); }, tuple);
  }
  template <typename T>
  static void collect(const T&, std::vector<at::Tensor>&) {}

 private:
  class Impl;
  std::shared_ptr<::torch::nn::Module> module_;
  DataParallelOptions options_;
  std::unique_ptr<Impl> impl_;
  bool sync_enabled_ = true;
  bool buffers_in_sync_ = true;
};

namespace detail {
template <typename M>
struct is_shared_ptr : std::false_type {};
template <typename T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};

template <typename M>
std::shared_ptr<::torch::nn::Module> module_base(const M& m) {
  if constexpr (is_shared_ptr<M>::value) {
    return m;  // std::shared_ptr<YourModuleImpl>
  } else {
    return m.ptr();  // a TORCH_MODULE holder
  }
}
}  // namespace detail

// M: std::shared_ptr<YourModuleImpl> or a TORCH_MODULE holder (torch::nn::Linear, ResNet18).
template <typename M>
class DataParallel : public DataParallelBase {
 public:
  explicit DataParallel(M module, DataParallelOptions options = {})
      : DataParallelBase(detail::module_base(module), std::move(options)),
        module_(std::move(module)) {}

  // Runs the module's forward with the arguments given; its result is returned unchanged.
  template <typename... Args>
  auto forward(Args&&... args) {
    return run(-1, std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return run(-1, std::forward<Args>(args)...);
  }
  // For unequal local batches: gradients are weighted by local_batch_size / (the sum over
  // ranks), so the result is the average over every sample of the global batch. Every rank
  // must use the same form of forward in an iteration.
  template <typename... Args>
  auto forward_weighted(int64_t local_batch_size, Args&&... args) {
    DPAR_CHECK(local_batch_size >= 0,
               "dpar::torch::DataParallel::forward_weighted: local batch size must be >= 0, got ",
               local_batch_size);
    return run(local_batch_size, std::forward<Args>(args)...);
  }

  // The wrapped module (save and evaluate through it; its parameter names have no prefix).
  M& module() { return module_; }
  const M& module() const { return module_; }

 private:
  template <typename... Args>
  auto run(int64_t local_batch, Args&&... args) {
    before_forward(local_batch);
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    collect(output, tensors);
    after_forward(tensors);
    return output;
  }

  M module_;
};

}  // namespace dpar::torch
