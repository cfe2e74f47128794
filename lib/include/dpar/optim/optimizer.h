#pragma once
// Optimizer base class: a flat list of parameters, one learning rate, and per-parameter state
// (momentum buffers, moment estimates, step counts) that can be saved and restored.
//
// Update rules follow PyTorch 1.13 (torch.optim.SGD / RMSprop / AdamW, single-tensor path)
// exactly, so trajectories match torch to float rounding.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::optim {

// Named state tensors. Keys are "<buffer>.<parameter index>" (e.g. "momentum_buffer.3",
// "exp_avg.0") plus "step.<parameter index>" (i64 scalar) for optimizers that count steps.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// A state-dict key split into its buffer name and parameter index; throws dpar::Error
// starting with `who` when the key does not end in an index below num_params.
std::pair<std::string, size_t> split_state_key(const std::string& key, size_t num_params,
                                               const std::string& who);

class Optimizer {
 public:
  // params: leaf tensors (f32); each must appear once. Their gradients are read in step().
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (parameters without one are skipped
  // and their state does not advance). Runs with gradient recording off; then the step hooks.
  void step();

  // Runs after every step() (torch's register_step_post_hook): sharded DataParallel gathers
  // the updated parameter slices there. Returns a handle for remove_step_hook.
  int add_step_hook(std::function<void()> hook);
  void remove_step_hook(int handle);
  // Runs the step hooks without an update: GradScaler does this for a step it skips, so that
  // what follows a step (a sharded DataParallel starts the next gradients afresh) follows it.
  void run_step_hooks();

  // For an optimizer over one rank's slices of sharded parameters (dist::DataParallel with
  // shard != none): sums a small f32 CPU tensor, in place, over the ranks that hold the other
  // slices, so that decisions that depend on every gradient (GradScaler's inf/nan check) are
  // the same on every rank. Empty (the default): the optimizer sees whole parameters.
  using CrossShardSum = std::function<void(Tensor&)>;
  void set_cross_shard_sum(CrossShardSum sum) { cross_shard_sum_ = std::move(sum); }
  const CrossShardSum& cross_shard_sum() const { return cross_shard_sum_; }

  // Swaps in a new list of parameters (as many or not) for a wrapper that lays its tensors
  // out anew, as sharded DataParallel does when it rebuilds its buckets after the first
  // iteration. Only before any state exists: throws dpar::Error (and changes nothing) otherwise.
  void replace_parameters(std::vector<Tensor> params);
  // Whether any parameter has state (has taken a step, or state was loaded).
  bool has_state() const;
  // Bytes of state held (buffers; step counts are not memory of note).
  size_t state_bytes() const;

  // Zeroes every defined gradient in place (the gradient tensors keep their storage, which
  // matters when they are views into shared buffers, as with DataParallel). set_to_none
  // instead drops the gradients so the next backward allocates fresh ones.
  void zero_grad(bool set_to_none = false);

  double lr() const { return lr_; }
  void set_lr(double lr);  // lr >= 0 and finite
  const std::vector<Tensor>& params() const { return params_; }
  // "SGD", "RMSprop", "AdamW": used in error messages.
  virtual const char* name() const = 0;

  // Whether step() updates all parameters of a device with one multi-tensor kernel call
  // where the device's backend has one (CUDA: one launch per step instead of one per
  // parameter, like PyTorch's foreach/fused optimizers; bitwise the same results). The CPU
  // always updates parameter by parameter. On by default; DPAR_OPTIM_MULTI_TENSOR=0 in the
  // environment turns it off for optimizers created afterwards (1 or empty: on).
  bool multi_tensor() const { return multi_tensor_; }
  void set_multi_tensor(bool enabled) { multi_tensor_ = enabled; }

  // The per-parameter state, contiguous. Tensors share memory with the live state when it is
  // already contiguous: clone them to keep a snapshot across later steps.
  virtual StateDict state_dict() const;
  // Replaces the whole state. Throws dpar::Error (and changes nothing) when an entry is
  // unknown to this optimizer with its current options (e.g. another optimizer's state),
  // names a parameter index out of range, has the wrong shape or dtype, or when a parameter's
  // state is incomplete.
  virtual void load_state_dict(const StateDict& state);

 protected:
  struct ParamState {
    bool initialized = false;
    int64_t step = 0;
    std::map<std::string, Tensor> buffers;  // same shape and layout as the (working) param
  };

  // The update itself (step() without the hooks).
  virtual void update() = 0;

  // The state buffer names this optimizer keeps per parameter, given its options.
  virtual std::vector<std::string> buffer_names() const = 0;
  // Whether per-parameter step counts are part of the state.
  virtual bool counts_steps() const = 0;

  // Operands of one parameter's update, all f32 on one device with the same dense layout so
  // that kernels can run over flat memory. param may be a temporary copy of a non-dense
  // parameter; finish() writes it back.
  struct Operands {
    size_t index = 0;
    Tensor param;
    Tensor grad;
    ParamState* state = nullptr;
  };
  // Prepares parameter i, or returns false when it has no gradient. Creates zero-filled state
  // buffers on first use (zero_init) or leaves them uninitialised for the kernel to fill.
  // Kernels read the step being taken as state->step + 1.
  bool prepare(size_t i, Operands& ops, bool zero_init);
  // After the update of ops: marks the state initialised, counts the step and writes a
  // non-dense parameter back. Nothing is counted for an update that did not run (a
  // multi-tensor call that threw), so the state stays consistent with the parameters.
  void finish(const Operands& ops);

  // Parameter indices grouped by the parameters' device, in order of first appearance (one
  // group in the common case): multi-tensor kernels update one device's group per call.
  std::vector<std::pair<Device, std::vector<size_t>>> params_by_device() const;

  void check_lr(double lr) const;

  double lr_ = 0;
  std::vector<Tensor> params_;
  std::vector<ParamState> state_;
  bool multi_tensor_ = true;

 private:
  void check_parameters() const;

  std::vector<std::pair<int, std::function<void()>>> step_hooks_;
  int next_hook_ = 0;
  CrossShardSum cross_shard_sum_;
};

}  // namespace dpar::optim
