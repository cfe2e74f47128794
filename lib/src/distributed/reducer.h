#pragma once
// Reducer: DataParallel's gradient machinery (see dpar/distributed/data_parallel.h).
//
// Parameters are grouped into buckets; each bucket is one flat buffer and every parameter's
// .grad is a view into it, so backward accumulates straight into communication memory and the
// optimizer reads the averaged result in place. Gradient-ready hooks count down each bucket;
// a full bucket is scaled (and, with comm_dtype bf16/f16, converted into its wire buffer) and
// its all-reduce launched (asynchronously, on the group's communication thread) while backward
// continues; a finished bucket is converted back when the next hook or the end notices it. Buckets
// launch strictly in index order so every rank issues the same collectives in the same order. A
// callback queued at the first hook of a backward (autograd::queue_callback) finishes the iteration
// when backward ends: unused parameters, waiting for the last buckets, statistics, and - once,
// after the first iteration - rebuilding the buckets in the order gradients actually became ready.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/optimizer_shards.h"
#include "dpar/distributed/process_group.h"

namespace dpar::dist {

// Broadcasts tensors of any dtypes and layouts from root as ONE collective: the tensors are
// packed bytewise into a single buffer (a broadcast moves bits, so their dtypes do not matter).
// purpose: what the broadcast is for, in the user's terms, when the user did not call it
// (DataParallel's own broadcasts); see wait_explained.
void broadcast_coalesced(Group& group, const std::vector<Tensor>& tensors, int root = 0,
                         const std::string& purpose = "");

// Waits for a collective that DataParallel issued on the user's behalf. Its failure comes back
// as "<purpose>: <the group's error>", and a rank still waiting after a quarter of the group's
// timeout (at most a minute) prints one line naming the purpose, so that a rank left alone in a
// collective the user never called is not silent until the timeout.
void wait_explained(Work& work, const Group& group, const std::string& purpose);

// A view of `bytes_offset` into buffer with like's shape, dtype and layout: a dense tensor
// (contiguous, or channels-last) keeps its strides, anything else gets contiguous ones. Either
// way it fills like.numel() elements from the offset: a parameter's home in a bucket.
Tensor view_at(const Tensor& buffer, size_t bytes_offset, const Tensor& like);

// Ends a step that every rank of group tried: throws `error` where it is not empty, and on the
// other ranks throws other_failed, so that no rank goes on alone (group null: only the former).
void fail_together(Group* group, const std::string& error, const std::string& other_failed);

// "all_reduce tensors: 142, after fusion: 3 buckets [1.0 MB, 8.7 MB, 25.1 MB]"
std::string format_bucket_summary(const std::vector<BucketInfo>& buckets);

// The autograd system whose parameters a Reducer serves: dpar's own (dist::DataParallel) or
// libtorch's (dpar::torch::DataParallel). The Reducer sees parameters and gradients as dpar
// tensors (for libtorch, zero-copy views of the same memory); parameter i of the binding is
// parameter i of the list given to the Reducer.
class AutogradBinding {
 public:
  virtual ~AutogradBinding() = default;
  // on_ready(i) must run once parameter i's gradient has been accumulated in a backward pass.
  virtual void install_hooks(std::function<void(size_t)> on_ready) = 0;
  virtual void remove_hooks() = 0;
  // Parameter i's gradient as a dpar tensor; undefined when it has none.
  virtual Tensor grad(size_t i) const = 0;
  // Whether parameter i's gradient is the memory of `view` (shape and strides included).
  virtual bool grad_is(size_t i, const Tensor& view) const = 0;
  // Makes `view` (a region of a bucket) parameter i's gradient.
  virtual void set_grad(size_t i, const Tensor& view) = 0;
  // Runs callback when the running backward pass ends (called from a gradient hook).
  virtual void at_end_of_backward(std::function<void()> callback) = 0;
  virtual bool grad_enabled() const = 0;

  // ---- sharding --------------------------------------------------------------------------
  // Makes `home` (parameter i's region of its bucket's flat parameter buffer, which holds its
  // values already) parameter i's memory. The Reducer re-points its own tensor for parameter i
  // first; dpar's binding shares that TensorImpl, so it has nothing more to do.
  virtual void relocate(size_t /*i*/, const Tensor& /*home*/) {}
  // slices: this rank's slice of each bucket's parameters, each with its gradient slice as
  // .grad(): what the binding's optimizers update (dpar's: these very tensors; libtorch's:
  // leaves over the same memory). Called whenever the buckets are laid out.
  virtual void set_slices(const std::vector<Tensor>& slices) = 0;
  // Bucket k's slice gradient as the optimizer sees it (undefined once set to none), and
  // making `grad` (a dpar tensor the Reducer owns) that gradient.
  virtual Tensor slice_grad(size_t k) const = 0;
  virtual void set_slice_grad(size_t k, const Tensor& grad) = 0;
};

class Reducer {
 public:
  struct Options {
    double first_bucket_mb = 1;
    double bucket_mb = 25;
    bool find_unused_parameters = false;
    DType comm_dtype = DType::f32;  // what f32 buckets travel as (DataParallelOptions)
    ShardMode shard = ShardMode::none;
  };

  // params: (name, tensor) of every parameter that requires grad, in registration order, each
  // tensor once (tied weights share one gradient); binding reaches them in the same order.
  Reducer(nn::NamedTensors params, std::unique_ptr<AutogradBinding> binding,
          std::shared_ptr<Group> group, Options options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called by DataParallel::forward before the module runs. sync: whether the coming backward
  // communicates (false inside no_sync()). local_batch >= 0 asks for sample weighting: the
  // batch sizes are summed over ranks here (asynchronously; awaited at the first bucket).
  void prepare_forward(bool sync, int64_t local_batch);
  // Called after the module's forward: with find_unused_parameters, reachable() walks the
  // output's autograd graph and says which parameters it depends on, so the buckets of the
  // others need not wait for the end of backward. reachable is called only when needed.
  void after_forward(const std::function<std::vector<bool>()>& reachable);

  // Checks a DataParallel's options (errors start with `who`) and gives the Reducer's.
  static Options options_from(const DataParallelOptions& options, const std::string& who);

  std::vector<BucketInfo> buckets() const;
  size_t num_parameters() const { return params_.size(); }

  // ---- sharding (options.shard != none; see reducer_shard.cpp) ----------------------------
  bool sharded() const { return options_.shard != ShardMode::none; }
  // This rank's slice of each bucket's parameters (views of the parameters' memory), one f32
  // tensor per bucket, each with its averaged gradient slice as .grad once a synchronised
  // backward has run: what the optimizer updates.
  std::vector<Tensor> shard_parameters() const;
  // All-gathers every bucket's updated slices into the parameters (after an optimizer step).
  // overlap: returns once the gathers are launched, each bucket's parameter memory gated until
  // its gather is done (Storage::set_pending_write), so the next forward waits bucket by bucket
  // at first use. Otherwise (libtorch parameters, which dpar's gate cannot see) it waits.
  void gather_parameters(bool overlap);
  // Waits for every gather still pending; the first failure is rethrown.
  void finish_gathers();
  // Called when the layout becomes final, at the end of the first synchronised backward (after
  // the rebuild; changed: the buckets were laid out anew, so shard_parameters() are new tensors).
  void set_layout_final_callback(std::function<void(bool changed)> callback) {
    on_layout_final_ = std::move(callback);
  }
  // This rank's slices as parameter pieces, one entry per bucket (shard_parameters() order).
  OptimizerLayout shard_layout() const;
  // Whether the bucket layout may still change (no synchronised backward has finished yet).
  bool layout_final() const { return rebuilt_; }
  // Asked (on every rank alike) before the rebuild after the first iteration: true keeps the
  // initial layout, because an optimizer already holds state for the initial slices.
  void set_layout_lock(std::function<bool()> locked) { layout_locked_ = std::move(locked); }
  // Bytes of gradient memory held now: bucket buffers (and wire buffers) plus gradient slices.
  size_t gradient_bytes() const;
  DataParallel::CommStats last_comm_stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Bucket {
    std::vector<size_t> params;    // indices into params_, in bucket order
    std::vector<int64_t> offsets;  // element offset of each parameter in buffer
    Tensor buffer;                 // flat, contiguous, one dtype/device
    Tensor wire;         // the buffer converted to comm_dtype for the all-reduce, if that differs
    size_t pending = 0;  // gradients not yet ready in the running backward
    std::shared_ptr<Work> work;
    Clock::time_point launched, completed;
    bool done = false;
    int64_t numel = 0;
    // Sharded: rank r owns elements [bounds[r], bounds[r + 1]) (allreduce's chunks, so the
    // reduce-scatter sums in the allreduce's order); the parameters are views of params_flat,
    // shard_param is this rank's slice of it, shard_grad its averaged gradient.
    std::vector<int64_t> bounds;
    Tensor params_flat, shard_param, shard_grad;
    // The slice's gradient was consumed by an optimizer step (or never set): the next
    // reduced slice replaces it instead of adding to it.
    bool consumed = true;
  };

  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket = 0;
    Tensor view;  // the gradient's home in the bucket (contiguous strides)
  };

  // Partitions `order` (parameter indices, the order gradients are expected) into buckets.
  std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& order) const;
  // Allocates buffers for a partition; gradients that exist move into the new views.
  void install_buckets(const std::vector<std::vector<size_t>>& partition);

  void on_grad_ready(size_t index);
  void begin_backward();
  void mark_ready(size_t index);
  void restore_view(size_t index, bool zero_if_missing);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  double scale_factor();
  void poll_completions();
  // Waits for bucket k (rethrowing its failure, named), marks it done and converts a
  // compressed bucket back into its gradients.
  void complete(size_t k);
  void finalize();
  // Waits for whatever was launched (errors ignored) and forgets the iteration: after an
  // error the next iteration must start from a clean state.
  void abandon_iteration();
  // Whether the buckets were laid out anew.
  bool rebuild_in_ready_order();
  void log_summary(const char* what) const;

  // Sharding (reducer_shard.cpp).
  // Allocates b's gradient buffer (released after each reduce-scatter with shard = gradients)
  // and points its parameters' gradient homes at it; gradients that exist move in.
  void allocate_buffer(Bucket& b);
  // The dtype bucket b travels in: comm_dtype for f32 buckets, else the bucket's own.
  DType wire_dtype(const Bucket& b) const;
  // Lays bucket b's parameters out in one flat buffer (each parameter becomes a view of it)
  // and makes this rank's slice and its gradient slice.
  void shard_bucket(Bucket& b);
  // Launches bucket b's reduce-scatter of its (scaled) buffer.
  void launch_reduce_scatter(Bucket& b);
  // After bucket k's reduction: its averaged slice is added to the gradient slice, and the
  // bucket's own memory is zeroed (shard = optimizer) or released (gradients).
  void hand_over(size_t k, bool whole_bucket_reduced);
  // Releases (gradients) or zeroes (optimizer) bucket b's memory once it is handed over.
  void clear_bucket(Bucket& b);
  // This rank's elements of bucket b: [first, second).
  std::pair<int64_t, int64_t> my_range(const Bucket& b) const;

  std::vector<Param> params_;
  std::unique_ptr<AutogradBinding> binding_;
  std::shared_ptr<Group> group_;
  Options options_;
  std::vector<Bucket> buckets_;

  // Per forward.
  bool sync_ = true;
  std::shared_ptr<Work> batch_work_;  // allreduce of the local batch size
  Tensor batch_sum_;
  int64_t local_batch_ = -1;
  std::vector<bool> reachable_;  // per parameter; empty when the graph was not walked

  // Per backward.
  bool active_ = false;
  std::vector<bool> ready_;
  size_t next_launch_ = 0;
  bool factor_known_ = false;
  double factor_ = 1;  // gradients are multiplied by this before the sum over ranks
  Clock::time_point backward_begin_;

  // Rebuild after the first synchronised iteration.
  bool rebuilt_ = false;
  std::vector<size_t> ready_order_;

  DataParallel::CommStats stats_;
  // Nanoseconds waited for all-gathers since the last synchronised backward (the gates' waits
  // may run on any thread, and after the Reducer is gone).
  std::shared_ptr<std::atomic<int64_t>> gather_wait_ns_ = std::make_shared<std::atomic<int64_t>>(0);

  std::function<bool()> layout_locked_;
  std::function<void(bool)> on_layout_final_;
};

}  // namespace dpar::dist
