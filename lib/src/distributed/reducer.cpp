#include "reducer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <tuple>

#include "distributed/flight_recorder.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"

namespace dpar::dist {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

// A view of `bytes_offset` into buffer with like's shape, dtype and layout: a dense tensor
// (contiguous, or channels-last as GPU convolution weights are) keeps its strides, so its
// gradient accumulates into the view and copies to and from it run over flat memory; anything
// else gets contiguous strides. Either way the view fills numel elements from the offset.
Tensor view_at(const Tensor& buffer, size_t bytes_offset, const Tensor& like) {
  const size_t base = static_cast<size_t>(buffer.storage_offset()) * dtype_size(buffer.dtype());
  const Shape strides = like.is_dense() ? like.strides() : contiguous_strides(like.shape());
  return Tensor::from_storage(
      buffer.storage(), static_cast<int64_t>((base + bytes_offset) / dtype_size(like.dtype())),
      like.shape(), strides, like.dtype());
}

void wait_explained(Work& work, const Group& group, const std::string& purpose) {
  using std::chrono::milliseconds;
  const Millis notice =
      std::clamp<Millis>(group.timeout() / 4, milliseconds(500),
                         std::chrono::duration_cast<Millis>(std::chrono::minutes(1)));
  try {
    try {
      work.wait(notice);
      return;
    } catch (const Error&) {
      if (work.is_completed()) throw;  // the collective's own failure
    }
    std::fprintf(stderr,
                 "dpar: rank %d has waited %.0f s in %s (rank %d of %d; the other ranks have not "
                 "joined it yet)\n",
                 group.rank(), std::chrono::duration<double>(notice).count(), purpose.c_str(),
                 group.rank(), group.size());
    std::fflush(stderr);
    work.wait();
  } catch (const std::exception& e) {
    DPAR_FAIL(purpose, ": ", e.what());
  }
}

void broadcast_coalesced(Group& group, const std::vector<Tensor>& tensors, int root,
                         const std::string& purpose) {
  // One packed buffer per device (the group routes by device).
  std::map<std::pair<int, int>, std::vector<size_t>> by_device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Device d = tensors[i].device();
    by_device[{static_cast<int>(d.type), d.index}].push_back(i);
  }
  NoGradGuard no_grad;
  // Recorded by the flight recorder with the broadcast: the purpose up to its explanation.
  const detail::CollectiveLabel label(purpose.substr(0, purpose.find(" (")));
  for (const auto& [key, members] : by_device) {
    std::vector<size_t> offsets;
    size_t total = 0;
    for (size_t i : members) {
      total = align_up(total, 8);  // every dtype's alignment
      offsets.push_back(total);
      total += tensors[i].nbytes();
    }
    total = align_up(total, 4);
    if (total == 0) continue;
    Tensor packed =
        Tensor::empty({static_cast<int64_t>(total / 4)}, DType::f32, tensors[members[0]].device());
    if (group.rank() == root) {
      for (size_t k = 0; k < members.size(); ++k) {
        view_at(packed, offsets[k], tensors[members[k]]).copy_(tensors[members[k]]);
      }
    }
    if (purpose.empty()) {
      group.broadcast({packed}, root, /*async_op=*/false);
    } else {
      wait_explained(*group.broadcast({packed}, root), group, purpose);
    }
    if (group.rank() != root) {
      for (size_t k = 0; k < members.size(); ++k) {
        Tensor dst = tensors[members[k]];
        dst.copy_(view_at(packed, offsets[k], dst));
      }
    }
  }
}

std::string format_bucket_summary(const std::vector<BucketInfo>& buckets) {
  size_t tensors = 0;
  for (const auto& b : buckets) tensors += b.parameter_names.size();
  std::string out = "all_reduce tensors: " + std::to_string(tensors) +
                    ", after fusion: " + std::to_string(buckets.size()) +
                    (buckets.size() == 1 ? " bucket [" : " buckets [");
  constexpr size_t kShown = 12;
  for (size_t i = 0; i < buckets.size() && i < kShown; ++i) {
    char size[32];
    const double mb = static_cast<double>(buckets[i].bytes) / kMiB;
    if (mb >= 0.1) {
      std::snprintf(size, sizeof(size), "%.1f MB", mb);
    } else {
      std::snprintf(size, sizeof(size), "%.1f KB", static_cast<double>(buckets[i].bytes) / 1024);
    }
    out += (i ? ", " : "") + std::string(size);
  }
  if (buckets.size() > kShown) out += ", ...";
  return out + "]";
}

// ---- construction ------------------------------------------------------------------------
Reducer::Options Reducer::options_from(const DataParallelOptions& options, const std::string& who) {
  DPAR_CHECK(options.comm_buffer_size > 0 && options.last_comm_buffer_size > 0, who,
             ": comm_buffer_size (", options.comm_buffer_size, " MB) and last_comm_buffer_size (",
             options.last_comm_buffer_size, " MB) must be positive");
  DPAR_CHECK(options.comm_dtype == DType::f32 || options.comm_dtype == DType::bf16 ||
                 options.comm_dtype == DType::f16,
             who, ": comm_dtype must be f32, bf16 or f16, got ", dtype_name(options.comm_dtype));
  Options out;
  out.first_bucket_mb = options.last_comm_buffer_size;
  out.bucket_mb = options.comm_buffer_size;
  out.find_unused_parameters = options.find_unused_parameters;
  out.comm_dtype = options.comm_dtype;
  out.shard = options.shard;
  return out;
}

Reducer::Reducer(nn::NamedTensors params, std::unique_ptr<AutogradBinding> binding,
                 std::shared_ptr<Group> group, Options options)
    : binding_(std::move(binding)), group_(std::move(group)), options_(options) {
  for (auto& [name, t] : params) {
    Param p;
    p.name = name;
    p.tensor = t;
    params_.push_back(std::move(p));
  }
  std::vector<size_t> order(params_.size());
  // Backward produces the last layers' gradients first.
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  install_buckets(assign_buckets(order));
  binding_->install_hooks([this](size_t i) { on_grad_ready(i); });
}

Reducer::~Reducer() {
  binding_->remove_hooks();
  abandon_iteration();
  try {
    // Parameters outlive the Reducer: their memory must not stay gated on its collectives.
    finish_gathers();
  } catch (const std::exception&) {
    // Destruction must not throw; the failure was (or will be) reported by the group.
  }
  if (batch_work_) {
    try {
      batch_work_->wait();
    } catch (const std::exception&) {
      // Destruction must not throw; the failure was (or will be) reported by the group.
    }
  }
}

std::vector<std::vector<size_t>> Reducer::assign_buckets(const std::vector<size_t>& order) const {
  struct Open {
    std::vector<size_t> members;
    size_t bytes = 0;
    bool first = true;
  };
  // Buckets hold one dtype on one device: a separate open bucket per (dtype, device).
  std::map<std::tuple<int, int, int>, Open> open;
  std::vector<std::vector<size_t>> closed;
  for (size_t idx : order) {
    const Tensor& t = params_[idx].tensor;
    Open& o =
        open[{static_cast<int>(t.dtype()), static_cast<int>(t.device().type), t.device().index}];
    o.members.push_back(idx);
    o.bytes += t.nbytes();
    // As DDP: a bucket closes once it reaches its size, so one large tensor is its own bucket.
    const double limit_mb = o.first ? options_.first_bucket_mb : options_.bucket_mb;
    if (static_cast<double>(o.bytes) >= limit_mb * kMiB) {
      closed.push_back(std::move(o.members));
      o = Open{{}, 0, false};
    }
  }
  for (auto& [key, o] : open) {
    if (!o.members.empty()) closed.push_back(std::move(o.members));
  }
  // Launch order = the order the buckets' first gradients are expected.
  std::vector<size_t> position(params_.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::stable_sort(closed.begin(), closed.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  return closed;
}

void Reducer::install_buckets(const std::vector<std::vector<size_t>>& partition) {
  NoGradGuard no_grad;
  std::vector<Bucket> fresh(partition.size());
  for (size_t bi = 0; bi < partition.size(); ++bi) {
    Bucket& b = fresh[bi];
    b.params = partition[bi];
    for (size_t idx : b.params) {
      b.offsets.push_back(b.numel);
      b.numel += params_[idx].tensor.numel();
      params_[idx].bucket = bi;
      params_[idx].view = Tensor();
    }
    b.bounds = allreduce_chunk_bounds(b.numel, group_->size(), dtype_size(wire_dtype(b)));
    // With shard = gradients a bucket's memory exists only from its first gradient to its
    // reduce-scatter; gradients that exist already (a backward before wrapping) move in now.
    bool any_grad = false;
    for (size_t idx : b.params) any_grad = any_grad || binding_->grad(idx).defined();
    if (options_.shard != ShardMode::gradients || any_grad) allocate_buffer(b);
    if (sharded()) shard_bucket(b);
  }
  buckets_ = std::move(fresh);
  if (sharded()) binding_->set_slices(shard_parameters());
}

DType Reducer::wire_dtype(const Bucket& b) const {
  const DType dtype = params_[b.params.front()].tensor.dtype();
  return dtype == DType::f32 ? options_.comm_dtype : dtype;
}

void Reducer::allocate_buffer(Bucket& b) {
  NoGradGuard no_grad;
  const Tensor& first = params_[b.params.front()].tensor;
  b.buffer = Tensor::zeros({b.numel}, first.dtype(), first.device());
  if (wire_dtype(b) != first.dtype()) {
    b.wire = Tensor::empty({b.numel}, options_.comm_dtype, first.device());
  }
  for (size_t k = 0; k < b.params.size(); ++k) {
    const size_t index = b.params[k];
    Param& p = params_[index];
    // In the parameter's layout (view_at): the bucket is flat memory either way.
    p.view =
        view_at(b.buffer, static_cast<size_t>(b.offsets[k]) * dtype_size(first.dtype()), p.tensor);
    Tensor g = binding_->grad(index);
    if (g.defined()) {
      p.view.copy_(g);
      binding_->set_grad(index, p.view);
    }
  }
}

std::vector<BucketInfo> Reducer::buckets() const {
  std::vector<BucketInfo> out;
  for (const auto& b : buckets_) {
    BucketInfo info;
    for (size_t idx : b.params) info.parameter_names.push_back(params_[idx].name);
    info.bytes = static_cast<size_t>(b.numel) * dtype_size(params_[b.params[0]].tensor.dtype());
    out.push_back(std::move(info));
  }
  return out;
}

void Reducer::log_summary(const char* what) const {
  if (group_->rank() != 0) return;
  std::printf("DataParallel: %s%s\n", what, format_bucket_summary(buckets()).c_str());
  std::fflush(stdout);
}

// ---- forward -------------------------------------------------------------------------------
void Reducer::prepare_forward(bool sync, int64_t local_batch) {
  // A backward that threw before finishing leaves collectives in flight: settle them.
  if (active_) abandon_iteration();
  if (batch_work_) batch_work_->wait();
  batch_work_.reset();
  sync_ = sync;
  local_batch_ = -1;
  reachable_.clear();
  if (sync && local_batch >= 0 && binding_->grad_enabled()) {
    // Summed over ranks while the forward computes; the first bucket launch needs it.
    local_batch_ = local_batch;
    batch_sum_ = Tensor::full({1}, static_cast<double>(local_batch));
    const detail::CollectiveLabel label("DataParallel batch sizes");
    batch_work_ = group_->allreduce({batch_sum_}, ReduceOp::Sum);
  }
}

void Reducer::after_forward(const std::function<std::vector<bool>()>& reachable) {
  if (!options_.find_unused_parameters || !sync_ || !binding_->grad_enabled()) return;
  reachable_ = reachable();
  if (!reachable_.empty()) {
    DPAR_CHECK(reachable_.size() == params_.size(),
               "DataParallel: internal error: ", reachable_.size(), " reachability flags for ",
               params_.size(), " parameters");
  }
}

// ---- backward ------------------------------------------------------------------------------
void Reducer::on_grad_ready(size_t index) {
  if (!sync_) {
    // no_sync(): accumulate locally, but keep the gradient in its bucket view.
    restore_view(index, false);
    return;
  }
  if (!active_) begin_backward();
  DPAR_CHECK(!ready_[index], "DataParallel: the gradient of '", params_[index].name,
             "' became ready twice in one backward pass");
  mark_ready(index);
}

void Reducer::begin_backward() {
  active_ = true;
  backward_begin_ = Clock::now();
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
    b.done = false;
  }
  ready_.assign(params_.size(), false);
  next_launch_ = 0;
  factor_known_ = false;
  if (!rebuilt_) ready_order_.clear();
  binding_->at_end_of_backward([this] { finalize(); });
  if (!reachable_.empty()) {
    // Parameters the forward output does not depend on get no gradient: count them as
    // ready (zero) now so their buckets do not wait for the end of backward.
    for (size_t i = params_.size(); i-- > 0;) {
      if (!reachable_[i]) mark_ready(i);
    }
  }
}

void Reducer::restore_view(size_t index, bool zero_if_missing) {
  Param& p = params_[index];
  if (p.view.defined() && binding_->grad_is(index, p.view)) return;
  NoGradGuard no_grad;
  Tensor g = binding_->grad(index);
  if (!g.defined() && !zero_if_missing) return;
  if (!p.view.defined()) allocate_buffer(buckets_[p.bucket]);  // released after the last step
  if (g.defined()) {
    // zero_grad(set_to_none) or a user assignment replaced the view: move the value home.
    p.view.copy_(g);
  } else if (zero_if_missing) {
    p.view.zero_();
  } else {
    return;
  }
  binding_->set_grad(index, p.view);
}

void Reducer::mark_ready(size_t index) {
  restore_view(index, true);
  ready_[index] = true;
  if (!rebuilt_) ready_order_.push_back(index);
  Bucket& b = buckets_[params_[index].bucket];
  if (--b.pending == 0) launch_ready_buckets();
  poll_completions();
}

void Reducer::launch_ready_buckets() {
  // Strictly in index order: every rank must issue the same collectives in the same order.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_++]);
  }
}

double Reducer::scale_factor() {
  if (local_batch_ < 0) return 1.0 / group_->size();
  batch_work_->wait();
  const double global = batch_sum_.item();
  DPAR_CHECK(global > 0, "DataParallel: the local batch sizes passed to forward() sum to ", global,
             " over all ranks; at least one sample is needed");
  return static_cast<double>(local_batch_) / global;
}

void Reducer::launch(Bucket& bucket) {
  if (!factor_known_) {
    factor_ = scale_factor();
    factor_known_ = true;
  }
  // Scaling before the sum (as DDP does) leaves nothing to do after the last all-reduce, so
  // the optimizer reads the result in place the moment communication ends.
  if (factor_ != 1.0) {
    NoGradGuard no_grad;
    mul_(bucket.buffer, factor_);
  }
  bucket.launched = Clock::now();
  const detail::CollectiveLabel label("DataParallel bucket " +
                                      std::to_string(&bucket - buckets_.data()));
  if (bucket.wire.defined()) {
    NoGradGuard no_grad;
    bucket.wire.copy_(bucket.buffer);
  }
  // Sharded, once the layout is final (the first iteration reduces whole buckets: its
  // gradients are laid out anew by the rebuild): each rank receives its slice only.
  if (sharded() && rebuilt_) {
    launch_reduce_scatter(bucket);
    return;
  }
  bucket.work =
      group_->allreduce({bucket.wire.defined() ? bucket.wire : bucket.buffer}, ReduceOp::Sum);
}

void Reducer::poll_completions() {
  for (size_t k = 0; k < next_launch_; ++k) {
    Bucket& b = buckets_[k];
    if (b.work && !b.done && b.work->is_completed()) complete(k);
  }
}

void Reducer::complete(size_t k) {
  Bucket& bucket = buckets_[k];
  try {
    bucket.work->wait();
  } catch (const std::exception& e) {
    // A rank that never ran backward leaves the others waiting until the timeout: say so then.
    // A peer that died or a group that was aborted is another story, which the hint would hide.
    const std::string what = e.what();
    const bool timed_out = what.find("timed out") != std::string::npos;
    DPAR_FAIL("DataParallel's gradient ", sharded() && rebuilt_ ? "reduce-scatter" : "all-reduce",
              " of bucket ", k, " (", bucket.params.size(), " parameters, ", bucket.numel,
              " elements) in backward failed",
              timed_out ? " (every rank must run backward on its DataParallel output)" : "", ": ",
              what);
  }
  bucket.done = true;
  bucket.completed = Clock::now();
  if (sharded() && rebuilt_) {
    hand_over(k, /*whole_bucket_reduced=*/false);
  } else if (bucket.wire.defined()) {
    NoGradGuard no_grad;
    bucket.buffer.copy_(bucket.wire);
  }
}

void Reducer::finalize() {
  const auto backward_end = Clock::now();
  try {
    std::vector<size_t> unused;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) unused.push_back(i);
    }
    if (!unused.empty() && !options_.find_unused_parameters) {
      std::string names;
      constexpr size_t kListed = 10;
      for (size_t k = 0; k < unused.size() && k < kListed; ++k) {
        names += (k ? ", " : "") + params_[unused[k]].name;
      }
      if (unused.size() > kListed) {
        names += " and " + std::to_string(unused.size() - kListed) + " more";
      }
      DPAR_FAIL("DataParallel: rank ", group_->rank(), ": ", unused.size(),
                " parameter(s) received no gradient in this backward pass: ", names,
                ". Pass find_unused_parameters = true in DataParallelOptions if they are "
                "legitimately unused (they then count as zero gradients), or make every "
                "forward output contribute to the loss");
    }
    for (auto it = unused.rbegin(); it != unused.rend(); ++it) mark_ready(*it);
    DPAR_CHECK(next_launch_ == buckets_.size(), "DataParallel: internal error: ", next_launch_,
               " of ", buckets_.size(), " buckets launched at the end of backward");
    for (size_t k = 0; k < buckets_.size(); ++k) {
      if (!buckets_[k].done) complete(k);
    }
  } catch (...) {
    abandon_iteration();
    throw;
  }

  // Communication statistics: the comm thread runs buckets one after another, so a bucket's
  // own duration starts when it was launched or when the previous one finished.
  double comm = 0;
  Clock::time_point previous = backward_begin_, last = backward_begin_;
  for (const auto& b : buckets_) {
    const auto start = std::max(b.launched, previous);
    comm += seconds(b.completed - start);
    previous = b.completed;
    last = std::max(last, b.completed);
  }
  stats_.comm_seconds = comm;
  stats_.exposed_seconds = std::max(0.0, seconds(last - backward_end));
  stats_.gather_wait_seconds = static_cast<double>(gather_wait_ns_->exchange(0)) * 1e-9;

  active_ = false;
  reachable_.clear();
  if (!rebuilt_) {
    const bool changed = rebuild_in_ready_order();
    // The first iteration reduced whole buckets: every rank takes its slices from them.
    if (sharded()) {
      for (size_t k = 0; k < buckets_.size(); ++k) hand_over(k, /*whole_bucket_reduced=*/true);
      if (on_layout_final_) on_layout_final_(changed);
    }
  }
}

void Reducer::abandon_iteration() {
  for (size_t k = 0; k < next_launch_ && k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (b.work && !b.done) {
      try {
        b.work->wait();
      } catch (const std::exception&) {
        // Already reported through the error that abandoned the iteration.
      }
    }
    b.done = true;
  }
  active_ = false;
  next_launch_ = 0;
  reachable_.clear();
  if (!rebuilt_) ready_order_.clear();
  // Sharded: what the failed backward left in the buckets is no one's gradient; the next
  // backward starts from nothing, as the slices do not hold it either.
  if (sharded() && rebuilt_) {
    for (Bucket& b : buckets_) clear_bucket(b);
  }
}

bool Reducer::rebuild_in_ready_order() {
  rebuilt_ = true;
  // Every rank answers alike (an optimizer's state is loaded on every rank or on none).
  if (layout_locked_ && layout_locked_()) {
    ready_order_ = {};
    return false;
  }
  const size_t n = params_.size();
  std::vector<size_t> order = std::move(ready_order_);
  ready_order_ = {};
  // Ranks must agree on the layout: everyone takes rank 0's observed order.
  Tensor shared = Tensor::empty({static_cast<int64_t>(n)});
  float* data = shared.data<float>();
  for (size_t i = 0; i < n; ++i) data[i] = i < order.size() ? static_cast<float>(order[i]) : -1.f;
  group_->broadcast({shared}, 0, /*async_op=*/false);
  std::vector<bool> seen(n, false);
  order.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const float v = data[i];
    const bool valid = v >= 0 && v < static_cast<float>(n) && !seen[static_cast<size_t>(v)];
    DPAR_CHECK(valid, "DataParallel: rank 0's gradient-ready order is not a permutation of the ", n,
               " parameters (entry ", i, " is ", v, ")");
    order[i] = static_cast<size_t>(v);
    seen[order[i]] = true;
  }
  auto partition = assign_buckets(order);
  std::vector<std::vector<size_t>> current;
  for (const auto& b : buckets_) current.push_back(b.params);
  if (partition == current) return false;
  install_buckets(partition);
  log_summary("buckets rebuilt in gradient-ready order: ");
  return true;
}

}  // namespace dpar::dist
