// The Reducer's sharded modes (DataParallelOptions::shard; ZeRO stages 1 and 2).
//
// A sharded bucket keeps its parameters in one flat buffer (each parameter tensor is re-pointed
// at its region, as Module::to re-points moved tensors), so that rank r's slice of the bucket,
// elements [bounds[r], bounds[r + 1]), is one contiguous tensor the optimizer can update, and
// the all-gather after the step writes every other rank's slice straight into the parameters.
// The bounds are allreduce_chunk_bounds: the reduce-scatter then adds each element in the same
// order as the allreduce of shard = none would, so both train bitwise alike.
//
// Gradients: backward accumulates into the bucket as without sharding; the bucket is scaled and
// reduce-scattered when full, and its reduced slice is added to the slice's gradient (the
// optimizer parameter's .grad, which accumulates over synchronised backwards until the user
// zeroes it, like .grad without sharding). The bucket itself is then zeroed (optimizer) or
// released (gradients: the parameters' .grad become undefined and the next backward allocates
// the bucket at its first gradient).
#include <algorithm>

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"
#include "reducer.h"

namespace dpar::dist {
namespace {

// A flat 1-D tensor over elements [begin, end) of `flat` (same storage, no autograd history).
Tensor flat_range(const Tensor& flat, int64_t begin, int64_t end) {
  return Tensor::from_storage(flat.storage(), flat.storage_offset() + begin, {end - begin}, {1},
                              flat.dtype());
}

// Every rank's piece of a flat bucket-sized tensor, in rank order (chunk bounds `bounds`).
std::vector<Tensor> pieces_of(const Tensor& flat, const std::vector<int64_t>& bounds) {
  std::vector<Tensor> pieces;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    pieces.push_back(flat_range(flat, bounds[r], bounds[r + 1]));
  }
  return pieces;
}

}  // namespace

const char* shard_mode_name(ShardMode mode) {
  switch (mode) {
    case ShardMode::none:
      return "none";
    case ShardMode::optimizer:
      return "optimizer";
    case ShardMode::gradients:
      return "gradients";
  }
  return "?";
}

ShardMode parse_shard_mode(const std::string& text) {
  if (text == "none") return ShardMode::none;
  if (text == "optimizer" || text == "os") return ShardMode::optimizer;
  if (text == "gradients" || text == "os_g") return ShardMode::gradients;
  DPAR_FAIL("shard mode '", text, "' is not one of none, optimizer (os), gradients (os_g)");
}

void Reducer::shard_bucket(Bucket& b) {
  NoGradGuard no_grad;
  const Tensor& first = params_[b.params.front()].tensor;
  DPAR_CHECK(first.dtype() == DType::f32, "DataParallel(shard = ", shard_mode_name(options_.shard),
             "): parameter '", params_[b.params.front()].name, "' is ", dtype_name(first.dtype()),
             "; sharding needs f32 parameters (the optimizers' dtype)");
  b.params_flat = Tensor::empty({b.numel}, first.dtype(), first.device());
  for (size_t k = 0; k < b.params.size(); ++k) {
    Tensor& p = params_[b.params[k]].tensor;
    // Same shape and (dense) strides: forward sees the same tensor.
    Tensor home =
        view_at(b.params_flat, static_cast<size_t>(b.offsets[k]) * dtype_size(p.dtype()), p);
    home.copy_(p);
    TensorImpl& impl = *p.impl();
    impl.storage = home.storage();
    impl.offset = home.storage_offset();
    impl.strides = home.strides();
    binding_->relocate(b.params[k], home);
  }
  const auto [lo, hi] = my_range(b);
  b.shard_param = flat_range(b.params_flat, lo, hi);
  b.shard_grad = Tensor::zeros({hi - lo}, first.dtype(), first.device());
  b.shard_param.set_grad(b.shard_grad);
}

std::pair<int64_t, int64_t> Reducer::my_range(const Bucket& b) const {
  const size_t rank = static_cast<size_t>(group_->rank());
  return {b.bounds[rank], b.bounds[rank + 1]};
}

std::vector<Tensor> Reducer::shard_parameters() const {
  std::vector<Tensor> out;
  for (const Bucket& b : buckets_) out.push_back(b.shard_param);
  return out;
}

OptimizerLayout Reducer::shard_layout() const {
  OptimizerLayout layout;
  for (const Param& p : params_) {
    const Tensor& t = p.tensor;
    layout.parameters.push_back({p.name, t.shape(), t.strides()});  // dense: views of params_flat
  }
  for (const Bucket& b : buckets_) {
    const auto [lo, hi] = my_range(b);
    std::vector<SlicePiece> pieces;
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int64_t start = b.offsets[k], stop = start + params_[b.params[k]].tensor.numel();
      const int64_t from = std::max(lo, start), to = std::min(hi, stop);
      if (from < to) pieces.push_back({b.params[k], from - start, to - start, from - lo});
    }
    layout.tensors.push_back(std::move(pieces));
    layout.tensor_shapes.push_back({hi - lo});
    layout.tensor_strides.push_back({1});
  }
  return layout;
}

void Reducer::launch_reduce_scatter(Bucket& b) {
  std::vector<Tensor> pieces = pieces_of(b.wire.defined() ? b.wire : b.buffer, b.bounds);
  // In place: this rank's piece receives the sum (the backends read every input first).
  Tensor mine = pieces[static_cast<size_t>(group_->rank())];
  b.work = group_->reduce_scatter(mine, std::move(pieces), ReduceOp::Sum);
}

void Reducer::hand_over(size_t k, bool whole_bucket_reduced) {
  NoGradGuard no_grad;
  Bucket& b = buckets_[k];
  const auto [lo, hi] = my_range(b);
  Tensor reduced = flat_range(b.buffer, lo, hi);
  // A compressed bucket's slice comes back from the wire format (a whole reduced bucket was
  // converted already).
  if (b.wire.defined() && !whole_bucket_reduced) reduced.copy_(flat_range(b.wire, lo, hi));
  // Synchronised backwards between two steps accumulate, as .grad does without sharding; the
  // first one after a step (or after zero_grad(set_to_none)) starts afresh, so a loop that
  // zeroes the model's gradients rather than the optimizer's still steps on this step's.
  Tensor current = binding_->slice_grad(k);
  if (b.consumed || !current.defined()) {
    b.shard_grad.copy_(reduced);
  } else {
    // The user assigned a gradient of their own: it is what accumulates.
    if (current.raw_data() != b.shard_grad.raw_data()) b.shard_grad.copy_(current);
    add_(b.shard_grad, reduced);
  }
  b.consumed = false;
  binding_->set_slice_grad(k, b.shard_grad);
  clear_bucket(b);
}

void Reducer::clear_bucket(Bucket& b) {
  if (!b.buffer.defined()) return;
  if (options_.shard == ShardMode::gradients) {
    for (size_t index : b.params) {
      binding_->set_grad(index, Tensor());
      params_[index].view = Tensor();
    }
    b.buffer = Tensor();
    b.wire = Tensor();
  } else {
    // Handed over: the next backward accumulates afresh (the slice's .grad keeps the sum).
    NoGradGuard no_grad;
    b.buffer.zero_();
  }
}

void Reducer::gather_parameters(bool overlap) {
  if (!sharded()) return;
  const char* purpose =
      "DataParallel's all-gather of the updated parameter slices after optimizer.step() (every "
      "rank must step the optimizer)";
  // The last bucket holds the first layers' parameters (buckets follow gradient order): the
  // forward's first needs go first.
  for (size_t k = buckets_.size(); k-- > 0;) {
    Bucket& b = buckets_[k];
    b.consumed = true;
    const std::shared_ptr<Storage>& home = b.params_flat.storage();
    // A gather still pending (a step that read nothing, as GradScaler's skipped step) ends
    // before the next one writes the same memory.
    home->finish_pending_write();
    // The collective writes through an alias of the parameters' storage, which stays gated
    // until the gather is done: the next forward waits for a bucket at its first use of one of
    // the bucket's parameters, and meanwhile computes with the buckets gathered already.
    const Tensor flat = Tensor::from_storage(Storage::alias(home), b.params_flat.storage_offset(),
                                             {b.numel}, {1}, b.params_flat.dtype());
    const auto [lo, hi] = my_range(b);
    std::shared_ptr<Work> work =
        group_->allgather(pieces_of(flat, b.bounds), flat_range(flat, lo, hi));
    std::shared_ptr<Group> group = group_;
    home->set_pending_write([work, group, purpose, waited = gather_wait_ns_] {
      const auto start = Clock::now();
      wait_explained(*work, *group, purpose);
      waited->fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    });
  }
  if (!overlap) finish_gathers();
}

void Reducer::finish_gathers() {
  // First-use order, as launched; the first failure propagates after every gate is open.
  std::exception_ptr failure;
  for (size_t k = buckets_.size(); k-- > 0;) {
    const Tensor& flat = buckets_[k].params_flat;
    try {
      if (flat.defined()) flat.storage()->finish_pending_write();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

size_t Reducer::gradient_bytes() const {
  size_t bytes = 0;
  for (const Bucket& b : buckets_) {
    if (b.buffer.defined()) bytes += b.buffer.nbytes();
    if (b.wire.defined()) bytes += b.wire.nbytes();
    if (b.shard_grad.defined()) bytes += b.shard_grad.nbytes();
  }
  return bytes;
}

}  // namespace dpar::dist
