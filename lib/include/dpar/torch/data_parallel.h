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
//     overlap statistics;
//   * shard = optimizer | gradients (ZeRO-1/2, docs/sharding.md): each rank's libtorch
//     optimizer updates its slice of every bucket only. Build it with
//       auto opt = ddp.make_optimizer<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-3));
//     whose step() ends with the all-gather of every rank's updated slices; clip with
//     ddp.clip_grad_norm(max_norm) (the global norm, not the slice's), and checkpoint the
//     optimizer with save_optimizer_state / load_optimizer_state (any number of ranks).
// A world of one (or a single process without init_parallel_env()) communicates nothing.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dpar/distributed/data_parallel.h"

namespace dpar::torch {

// The same options as dpar::dist::DataParallel (comm_buffer_size, last_comm_buffer_size,
// find_unused_parameters, broadcast_buffers, comm_dtype, shard, group). overlap_gather does
// not apply: a libtorch module's all-gather completes inside the optimizer's step().
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

  // ---- the optimizer ---------------------------------------------------------------------
  // What an optimizer for this model updates: the module's parameters (shard = none, or a
  // world of one) or, sharded, this rank's slice of each bucket: one flat float libtorch leaf
  // per bucket over the parameters' own memory, whose .grad() is the slice's averaged gradient
  // after a synchronised backward (it accumulates over synchronised backwards until zeroed).
  // The first synchronised backward lays the buckets out anew; optimizers made by
  // make_optimizer() follow.
  std::vector<at::Tensor> optimizer_parameters() const;
  // Opt(optimizer_parameters(), options) whose step() is followed, when sharded, by the
  // all-gather of every rank's updated slices into the parameters (libtorch optimizers have no
  // step hooks; this is Opt with step() overridden). Every rank must step. Opt is any
  // torch::optim optimizer constructible from (params, options), e.g.
  //   auto opt = ddp.make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1));
  template <class Opt, class Options>
  std::shared_ptr<Opt> make_optimizer(const Options& options);
  // Clips the gradients of optimizer_parameters() by their global 2-norm (as
  // torch::nn::utils::clip_grad_norm_ on one process) and returns that norm: sharded, the sum
  // of squares of every rank's slices is all-reduced once, so each rank clips alike.
  double clip_grad_norm(double max_norm);
  dist::ShardMode shard() const { return options_.shard; }
  // Parameters, gradient memory (buckets and slices) and the state of the optimizers made by
  // make_optimizer(), in bytes, on this rank.
  dist::ShardMemory memory_stats() const;
  // The optimizer's state as a shard set (dpar/distributed/optimizer_shards.h: one file per
  // rank plus an index, written atomically, CRC-checked), collective. SGD, Adam, AdamW and
  // RMSprop states are understood; the names are dpar's (exp_avg, momentum_buffer, ...), so the
  // set also loads into dpar's own optimizers.
  void save_optimizer_state(const ::torch::optim::Optimizer& optimizer,
                            const std::string& dir) const;
  // Reads the shard set dir (written by any number of ranks, sharded or not) into an optimizer
  // made by make_optimizer(); each rank reads only its slices' pieces. Before the first
  // synchronised backward the layout is not final: the state is then loaded at the end of
  // that backward. A failure on any rank throws on every rank.
  void load_optimizer_state(const std::shared_ptr<::torch::optim::Optimizer>& optimizer,
                            const std::string& dir);
  // Where each optimizer_parameters() tensor lies in the model.
  dist::OptimizerLayout optimizer_layout() const;

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
  // Sharding is on and there are other ranks to share with.
  bool sharded() const;
  // Records an optimizer made by make_optimizer() (it follows the layout; its state locks
  // it) and returns what its step() runs after the optimizer's own.
  std::function<void()> attach_optimizer(const std::shared_ptr<::torch::optim::Optimizer>& opt);
  void follow_relayout();
  void check_optimizer_attached() const;
  void apply_optimizer_state(::torch::optim::Optimizer& optimizer, const std::string& dir);

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

// Opt whose step() runs `after` once Opt's own step is done (make_optimizer).
template <class Opt>
class StepFollowed final : public Opt {
 public:
  template <class Options>
  StepFollowed(std::vector<at::Tensor> params, const Options& options)
      : Opt(std::move(params), options) {}
  at::Tensor step(::torch::optim::Optimizer::LossClosure closure = nullptr) override {
    at::Tensor loss = Opt::step(std::move(closure));
    if (after) after();
    return loss;
  }
  std::function<void()> after;
};
}  // namespace detail

template <class Opt, class Options>
std::shared_ptr<Opt> DataParallelBase::make_optimizer(const Options& options) {
  auto optimizer = std::make_shared<detail::StepFollowed<Opt>>(optimizer_parameters(), options);
  optimizer->after = attach_optimizer(optimizer);
  return optimizer;
}

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
