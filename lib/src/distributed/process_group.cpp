// Options, names, make_gloo_group, and Group: the device router in front of the backends.
#include "dpar/distributed/process_group.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/cuda_backend.h"
#include "distributed/gloo/process_group_gloo.h"
#include "distributed/gpu_groups.h"
#include "distributed/store_common.h"

namespace dpar::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "unknown";
}

namespace {
void check_cuda_backend(const std::string& name, const std::string& where) {
  DPAR_CHECK(name == "nccl" || name == "gloo", where, ": unknown collective backend '", name,
             "' (expected nccl or gloo)");
}
}  // namespace

ProcessGroupOptions ProcessGroupOptions::from_env() {
  ProcessGroupOptions options;
  if (auto t = detail::seconds_from_env("DPAR_TIMEOUT", false)) options.timeout = *t;
  if (auto t = detail::seconds_from_env("DPAR_STALL_WARNING", true)) options.stall_warning = *t;
  if (const char* text = std::getenv("DPAR_DEBUG"); text != nullptr && *text != '\0') {
    std::string level = text;
    for (char& c : level) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    DPAR_CHECK(level == "OFF" || level == "INFO" || level == "DETAIL",
               "DPAR_DEBUG: expected OFF, INFO or DETAIL, got '", text, "'");
    options.debug_detail = level == "DETAIL";
    options.debug_info = level != "OFF";
  }
  if (const char* text = std::getenv("DPAR_DIST_BACKEND"); text != nullptr && *text != '\0') {
    options.cuda_backend = text;
    check_cuda_backend(options.cuda_backend, "DPAR_DIST_BACKEND");
  }
  if (const char* text = std::getenv("DPAR_SHM"); text != nullptr && *text != '\0') {
    const std::string value = text;
    DPAR_CHECK(value == "0" || value == "1", "DPAR_SHM: expected 1 or 0, got '", value, "'");
    options.shared_memory = value == "1";
  }
  return options;
}

std::shared_ptr<ProcessGroup> make_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                                              const ProcessGroupOptions& options) {
  return std::make_shared<detail::ProcessGroupGloo>(std::move(store), rank, size, options);
}

// ---- Group ---------------------------------------------------------------------------------

struct Group::AbortState {
  std::mutex mutex;
  std::string reason;
};

Group::Group(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      abort_state_(std::make_shared<AbortState>()) {
  DPAR_CHECK(size >= 1 && rank >= 0 && rank < size, "Group: rank ", rank,
             " is outside a world of size ", size);
  DPAR_CHECK(store_ != nullptr || size == 1, "Group: a world of ", size, " needs a store");
  check_cuda_backend(options_.cuda_backend, "Group");
  // The backends' connect stops when the group is aborted (or the caller's own hook says so).
  options_.cancel_connect = [state = abort_state_, outer = options_.cancel_connect] {
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (!state->reason.empty()) return "the group was aborted: " + state->reason;
    }
    return outer ? outer() : std::string();
  };
}

std::string Group::abort_reason() const {
  std::lock_guard<std::mutex> lock(abort_state_->mutex);
  return abort_state_->reason;
}

void Group::adopt(DeviceType type, const std::shared_ptr<ProcessGroup>& backend) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    backends_[static_cast<int>(type)] = backend;
  }
  // An abort that came while it connected may have missed it (abort() aborts what backends_
  // holds): abort it here too (aborting twice is harmless).
  const std::string why = abort_reason();
  if (why.empty()) return;
  backend->abort(why);
  DPAR_FAIL("Group (rank ", rank_, " of ", size_, "): the group was aborted: ", why);
}

std::shared_ptr<ProcessGroup> Group::backend_ptr_for(Device device) {
  // Backends are created on first use, possibly from several threads (e.g. a data loader and
  // the training loop); creation rendezvouses with the other ranks, so it runs exactly once,
  // under create_mutex_ (abort() does not take it: it stops the connect through
  // cancel_connect instead of waiting for it).
  auto created = [&](DeviceType type) {
    std::lock_guard<std::mutex> lock(mutex_);
    return backends_[static_cast<int>(type)];
  };
  const std::string why = abort_reason();
  DPAR_CHECK(why.empty(), "Group (rank ", rank_, " of ", size_, "): the group was aborted: ", why);
  if (auto slot = created(device.type)) return slot;  // every collective after the first
  std::lock_guard<std::mutex> creating(create_mutex_);
  if (auto slot = created(device.type)) return slot;  // another thread created it meanwhile
  auto cpu = created(DeviceType::CPU);
  if (!cpu && (device.type == DeviceType::CPU || options_.cuda_backend == "gloo")) {
    cpu = make_gloo_group(store_, rank_, size_, options_);
    adopt(DeviceType::CPU, cpu);
  }
  if (device.type == DeviceType::CPU) return cpu;
  std::shared_ptr<ProcessGroup> made;
  if (options_.cuda_backend == "gloo") {
    made = detail::make_staged_gloo_group(cpu);
  } else {
    DPAR_CHECK(built_with_cuda(), "Group: cannot run collectives on ", device.str(),
               " tensors: dpar was built without CUDA, so there is no NCCL backend");
    made = detail::make_nccl_group(store_, rank_, size_, options_);
  }
  adopt(device.type, made);
  return made;
}

ProcessGroup& Group::backend_for(Device device) { return *backend_ptr_for(device); }

void Group::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(abort_state_->mutex);
    if (abort_state_->reason.empty()) abort_state_->reason = why.empty() ? "aborted" : why;
  }
  std::vector<std::shared_ptr<ProcessGroup>> created;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& backend : backends_) {
      if (backend) created.push_back(backend);
    }
  }
  // Outside the lock: a backend's abort may wait (briefly) for its communication thread.
  for (const auto& backend : created) backend->abort(why);
}

namespace {

Device common_device(const std::vector<Tensor>& tensors, const char* op) {
  DPAR_CHECK(!tensors.empty(), op, ": no tensors given");
  DPAR_CHECK(tensors[0].defined(), op, ": got an undefined tensor");
  const Device device = tensors[0].device();
  for (const Tensor& t : tensors) {
    DPAR_CHECK(t.defined(), op, ": got an undefined tensor");
    DPAR_CHECK(t.device() == device, op, ": all tensors must be on one device, got ", device.str(),
               " and ", t.device().str());
  }
  return device;
}

}  // namespace

std::shared_ptr<Work> Group::allreduce(std::vector<Tensor> tensors, ReduceOp op, bool async_op) {
  const Device device = common_device(tensors, "allreduce");
  return backend_for(device).allreduce(std::move(tensors), op, async_op);
}

std::shared_ptr<Work> Group::broadcast(std::vector<Tensor> tensors, int root, bool async_op) {
  const Device device = common_device(tensors, "broadcast");
  return backend_for(device).broadcast(std::move(tensors), root, async_op);
}

std::vector<int64_t> allreduce_chunk_bounds(int64_t numel, int size, size_t element_size) {
  DPAR_CHECK(numel >= 0 && size >= 1 && element_size >= 1,
             "allreduce_chunk_bounds: bad arguments (", numel, " elements, ", size, " ranks)");
  // Whole 64-byte blocks, spread as evenly as whole blocks allow (the first ranks take one more);
  // the last block may be partial.
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(element_size));
  const int64_t blocks = (numel + align - 1) / align;
  const int64_t base = blocks / size, extra = blocks % size;
  std::vector<int64_t> bounds(static_cast<size_t>(size) + 1);
  for (int64_t r = 0; r <= size; ++r) {
    bounds[static_cast<size_t>(r)] = std::min(numel, align * (r * base + std::min(r, extra)));
  }
  return bounds;
}

std::shared_ptr<Work> Group::allgather(std::vector<Tensor> outputs, Tensor input, bool async_op) {
  DPAR_CHECK(input.defined(), "allgather: the input is undefined");
  outputs.push_back(input);
  const Device device = common_device(outputs, "allgather");
  outputs.pop_back();
  return backend_for(device).allgather(std::move(outputs), std::move(input), async_op);
}

std::shared_ptr<Work> Group::reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op,
                                            bool async_op) {
  DPAR_CHECK(output.defined(), "reduce_scatter: the output is undefined");
  inputs.push_back(output);
  const Device device = common_device(inputs, "reduce_scatter");
  inputs.pop_back();
  return backend_for(device).reduce_scatter(std::move(output), std::move(inputs), op, async_op);
}

void Group::barrier() { backend_for(Device::cpu()).barrier(/*async_op=*/false); }

namespace detail {
// NCCL lives in the CUDA backend library, loaded here if no CUDA tensor has loaded it yet.
std::shared_ptr<ProcessGroup> make_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                              const ProcessGroupOptions& options) {
  const ::dpar::detail::CudaBackendApi* api = ::dpar::detail::cuda_backend();
  DPAR_CHECK(api != nullptr,
             "make_nccl_group: there is no NCCL backend: ", ::dpar::detail::cuda_backend_error());
  return api->make_nccl_group(std::move(store), rank, size, options);
}
}  // namespace detail

std::vector<std::string> allgather_strings(Group& group, const std::string& mine) {
  const int n = group.size();
  std::vector<Tensor> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(Tensor::zeros({1}, DType::i64));
  group.allgather(lengths,
                  Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, {1}),
                  /*async_op=*/false);
  std::vector<Tensor> texts;
  for (int r = 0; r < n; ++r) {
    texts.push_back(Tensor::zeros({lengths[r].to_int_vector()[0]}, DType::u8));
  }
  Tensor input = Tensor::zeros({static_cast<int64_t>(mine.size())}, DType::u8);
  if (!mine.empty()) std::memcpy(input.raw_data(), mine.data(), mine.size());
  group.allgather(texts, input, /*async_op=*/false);
  std::vector<std::string> out;
  for (const Tensor& t : texts) {
    out.emplace_back(static_cast<const char*>(t.raw_data()), static_cast<size_t>(t.nbytes()));
  }
  return out;
}

}  // namespace dpar::dist
