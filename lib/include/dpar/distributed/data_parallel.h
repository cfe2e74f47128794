#pragma once
// DataParallel: wraps a module so that, after backward, every rank holds the same averaged
// gradients, as paddle.DataParallel / torch DDP do.
//   * construction broadcasts parameters and buffers from rank 0 and verifies that every rank
//     has the same parameter names, shapes and dtypes (a mismatch names the first difference);
//   * gradients are views into fused buckets (first bucket last_comm_buffer_size MB, then
//     comm_buffer_size MB), filled in reverse parameter order and rebuilt once after the first
//     iteration in the order gradients actually became ready;
//   * a bucket's all-reduce starts on a communication thread the moment its last gradient is
//     ready (autograd gradient-ready hooks), overlapping with the rest of backward;
//   * no_sync() skips communication for gradient accumulation;
//   * unused parameters are an error naming them, unless find_unused_parameters;
//   * unequal local batch sizes give the sample-weighted average (pass the batch size);
//   * broadcast_buffers: rank 0's buffers (BN running statistics) go to every rank before
//     each training forward;
//   * comm_dtype = bf16 or f16 sends gradients compressed (half the bytes), as DDP's
//     bf16_compress_hook / fp16_compress_hook and fleet's fp16_allreduce do.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/optimizer_shards.h"
#include "dpar/distributed/process_group.h"
#include "dpar/nn/module.h"
#include "dpar/optim/optimizer.h"

namespace dpar::dist {

// What DataParallel splits across ranks (ZeRO stages 1 and 2; paddle's group_sharded_parallel
// levels "os" and "os_g"). See docs/sharding.md.
//   none:      every rank keeps the whole averaged gradient and the whole optimizer state.
//   optimizer: each bucket is reduce-scattered; every rank keeps the averaged gradient and the
//              optimizer state of its slice only and updates that slice; the updated slices
//              are all-gathered into every rank's parameters after the step.
//   gradients: as optimizer, and each bucket's gradient memory is released once its slice is
//              reduced (a bucket lives from its first gradient to its reduce-scatter).
enum class ShardMode { none, optimizer, gradients };
const char* shard_mode_name(ShardMode mode);
// "none", "optimizer" or "gradients" (also paddle's "os" and "os_g"); anything else throws
// dpar::Error naming the value and the choices.
ShardMode parse_shard_mode(const std::string& text);

struct DataParallelOptions {
  double comm_buffer_size = 25;      // MB, buckets after the first
  double last_comm_buffer_size = 1;  // MB, the first bucket (the last layers' gradients)
  bool find_unused_parameters = false;
  // Rank 0's buffers (BN running_mean/running_var/num_batches_tracked, ...) overwrite every
  // rank's before each training-mode forward, and before the first eval-mode forward after
  // training, as DDP's broadcast_buffers: one fused broadcast of all buffers per forward.
  // Every rank must run those forwards. false: each rank keeps the statistics of its own
  // batches (they are equal only after construction, which always broadcasts).
  bool broadcast_buffers = true;
  // The dtype f32 gradients travel in: f32 (exact), bf16 or f16 (half the bytes). Each bucket
  // is scaled, converted, summed over ranks (in f32, rounded to the format at each step) and
  // converted back into the f32 gradients. bf16 keeps f32's range with 8 bits of mantissa, f16
  // 11 bits in a range that small or large gradients can leave. Buckets of other dtypes
  // travel as they are.
  DType comm_dtype = DType::f32;
  // What is split across ranks (see ShardMode). With sharding, build the optimizer with
  // make_optimizer() (or from optimizer_parameters() and attach_optimizer()): it updates this
  // rank's slices, and each step ends with the all-gather of every rank's updated slices.
  ShardMode shard = ShardMode::none;
  // Sharded: step() returns once the all-gather is launched, and the next forward waits for
  // each bucket at the first use of one of its parameters (docs/sharding.md). false: the
  // gather completes inside step() (to measure what the overlap hides, or to rule it out).
  bool overlap_gather = true;
  // default: default_group_ptr(). With a group of one (a single process, or
  // init_parallel_env() in a world of one) DataParallel is a plain wrapper that communicates
  // nothing. Without init_parallel_env() it is the same in a single process, but in a process
  // a launcher started as one rank of several (DPAR_WORLD_SIZE, WORLD_SIZE, ... > 1) the
  // constructor throws naming the variable: every rank would otherwise train alone.
  std::shared_ptr<Group> group;
};

struct BucketInfo {
  std::vector<std::string> parameter_names;
  size_t bytes = 0;
};

class Reducer;

// Bytes one rank holds for training (DataParallel::memory_stats; the train log line).
struct ShardMemory {
  size_t parameters = 0;       // the whole model: every rank runs the whole forward
  size_t gradients = 0;        // bucket memory held now plus the averaged gradient slices
  size_t optimizer_state = 0;  // of the attached optimizers (momentum, moments, step counts)
};

class DataParallel : public nn::Module {
 public:
  explicit DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options = {});
  ~DataParallel() override;

  Tensor forward(const Tensor& input) override;
  // For unequal local batches: gradients are weighted by local_batch / global_batch, where
  // global_batch is the sum over ranks (an all-reduce issued here, overlapping the forward).
  // Every rank must use the same form of forward in a given iteration.
  Tensor forward(const Tensor& input, int64_t local_batch_size);

  // The wrapped module's own names (no "module." prefix), like paddle.DataParallel, so
  // checkpoints load into an unwrapped model. parameters()/buffers()/zero_grad() follow.
  nn::NamedTensors named_parameters(bool recurse = true) const override;
  nn::NamedTensors named_buffers(bool recurse = true) const override;
  nn::NamedTensors state_dict() const override;
  nn::LoadReport load_state_dict(const nn::NamedTensors& entries, bool strict = true) override;
  nn::LoadReport compare_state_dict(const nn::NamedTensors& entries) const override;
  // The module's gradients and, with sharding, the averaged gradient slices the optimizer reads.
  void zero_grad(bool set_to_none = false) override;

  // RAII scope in which backward accumulates gradients locally without communication. As in
  // DDP, what counts is whether the forward ran inside the scope; the next synchronised
  // backward reduces the accumulated sums.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallel& dp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DataParallel& dp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // ---- the optimizer ---------------------------------------------------------------------
  // What an optimizer for this model updates: parameters() with shard = none (or a world of
  // one); with sharding, this rank's slice of each bucket's parameters, one flat f32 tensor
  // per bucket (views of the parameters' memory) whose .grad is the averaged gradient of the
  // slice after a synchronised backward. The first synchronised backward lays the buckets out
  // in gradient-ready order, which makes new slices: an attached optimizer follows.
  std::vector<Tensor> optimizer_parameters() const;
  // Connects an optimizer built from optimizer_parameters(): with sharding, each step() ends
  // with the all-gather of the updated slices into every rank's parameters, GradScaler's
  // inf/nan decision and optim::clip_grad_norm's norm span every rank's slices, and the
  // optimizer follows the layout. Without sharding it records the optimizer (memory_stats).
  void attach_optimizer(const std::shared_ptr<optim::Optimizer>& optimizer);
  // Builds Opt(optimizer_parameters(), options) and attaches it:
  //   auto opt = dp.make_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-3});
  template <class Opt, class Options>
  std::shared_ptr<Opt> make_optimizer(const Options& options) {
    auto optimizer = std::make_shared<Opt>(optimizer_parameters(), options);
    attach_optimizer(optimizer);
    return optimizer;
  }
  ShardMode shard() const { return options_.shard; }
  // The group it synchronises over; null in a single process without init_parallel_env().
  const std::shared_ptr<Group>& group() const { return options_.group; }
  ShardMemory memory_stats() const;

  // ---- optimizer state across world sizes (dpar/distributed/optimizer_shards.h) -------------
  // Where each optimizer_parameters() tensor lies in the model.
  OptimizerLayout optimizer_layout() const;
  // Loads an attached optimizer's state from source(optimizer_layout()), e.g.
  //   [&](const OptimizerLayout& l) { return read_optimizer_shards(dir, l, opt->name()); }
  // Before the first synchronised backward a sharded layout is not final yet (the buckets are
  // laid out in gradient-ready order then): the state is then loaded at the end of that
  // backward, before the optimizer's first step. Every rank must call it; a failure on any
  // rank throws on every rank (the failing rank's message, or a line naming it).
  using OptimizerStateSource = std::function<optim::StateDict(const OptimizerLayout&)>;
  void load_optimizer_state(const std::shared_ptr<optim::Optimizer>& optimizer,
                            OptimizerStateSource source);
  // Writes the attached optimizer's state as a shard set (every rank; collective); a state
  // load_optimizer_state() has not applied yet is the one written.
  void save_optimizer_state(const optim::Optimizer& optimizer, const std::string& dir) const;

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  std::vector<BucketInfo> buckets() const;
  // "all_reduce tensors: 142, after fusion: 3 buckets [1.0 MB, 8.7 MB, ...]"
  std::string bucket_summary() const;
  // Communication of the last synchronised backward (for overlap reports). Buckets run one
  // after another on the communication thread; a bucket's duration runs from its launch (or
  // the previous bucket's end) to its completion, observed at the next gradient hook or at
  // the final wait, so durations of buckets that finish mid-backward are upper bounds.
  struct CommStats {
    double comm_seconds = 0;     // sum over buckets of all-reduce durations
    double exposed_seconds = 0;  // communication still running after backward's last node:
                                 // the part the overlap did not hide
    // Sharded: time this rank waited for the all-gather of updated slices since the previous
    // synchronised backward (in the step, or at the first use of a bucket in the forward):
    // the part of the gather the overlap with the forward did not hide.
    double gather_wait_seconds = 0;
  };
  CommStats last_comm_stats() const;

 private:
  Tensor run_forward(const Tensor& input, int64_t local_batch_size);

  std::shared_ptr<nn::Module> module_;
  DataParallelOptions options_;
  // Sharded: an optimizer must be attached before the second iteration (the first one's step
  // must have gathered the slices).
  void check_optimizer_attached() const;
  // Sharded: attached optimizers take the new slices after the rebuild.
  void follow_relayout();
  void apply_optimizer_state(optim::Optimizer& optimizer, const OptimizerStateSource& source);

  std::vector<Tensor> trainable_params_;  // the Reducer's parameters, in its order
  std::shared_ptr<Reducer> reducer_;      // shared: optimizers' step hooks hold it weakly
  std::vector<std::weak_ptr<optim::Optimizer>> optimizers_;
  // A load_optimizer_state() waiting for the final layout.
  std::shared_ptr<optim::Optimizer> pending_optimizer_;
  OptimizerStateSource pending_source_;
  bool sync_enabled_ = true;
  // No training forward has changed the buffers since rank 0's were last broadcast.
  bool buffers_in_sync_ = true;
};

}  // namespace dpar::dist
