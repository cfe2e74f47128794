// ProcessGroupNccl's life cycle: communicators, the stream/event protocol around each
// collective, the watchdog and failures. The collectives themselves are in nccl_collectives.cpp.
#include "distributed/nccl/process_group_nccl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "dpar/core/error.h"
#include "tensor/cuda/backend.h"
#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_context.h"

namespace dpar::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// "unhandled system error (Connection closed by remote peer ...)": the result's name plus
// NCCL's last message for this thread, on one line.
std::string nccl_error_text(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

// A non-blocking communicator is finalised (its outstanding operations flushed, its peers told)
// before it is destroyed; false when that fails or takes longer than `timeout`.
bool finalized(ncclComm_t comm, Millis timeout) {
  ncclResult_t result = ncclCommFinalize(comm);
  const auto deadline = Clock::now() + timeout;
  while (result == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) return false;
  }
  return result == ncclSuccess;
}

}  // namespace

// ---- NcclWork --------------------------------------------------------------------------------

NcclWork::NcclWork(std::shared_ptr<ProcessGroupNccl> group, CollectiveInfo info, int device,
                   cudaEvent_t end)
    : group_(group), info_(std::move(info)), device_(device), end_(end) {}

NcclWork::~NcclWork() {
  if (end_ != nullptr) (void)cudaEventDestroy(end_);
}

bool NcclWork::is_completed() {
  auto group = group_.lock();
  if (group && !group->failure().empty()) return true;  // completed with the group's error
  return cudaEventQuery(end_) != cudaErrorNotReady;
}

void NcclWork::wait(Millis timeout) {
  auto group = group_.lock();
  auto throw_failure = [&] {
    if (!group) return;
    const std::string failure = group->failure();
    DPAR_CHECK(failure.empty(), failure);
  };
  throw_failure();
  if (timeout.count() > 0) {
    // The caller asked for a bounded host wait (torch's work.wait(timeout)).
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const cudaError_t state = cudaEventQuery(end_);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) cuda::check(state, "collective completion");
      throw_failure();
      DPAR_CHECK(Clock::now() < deadline, info_.describe(), " #", info_.seq, " on rank ",
                 group ? group->rank() : -1, " (cuda:", device_, ") did not complete within ",
                 format_duration(timeout), " (Work::wait timeout)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Whatever the caller enqueues next on its stream runs after the collective.
  cuda::DeviceGuard guard(Device::cuda(device_));
  cuda::check(cudaStreamWaitEvent(cuda::current_stream(device_), end_, 0), "cudaStreamWaitEvent");
}

// ---- group -------------------------------------------------------------------------------------

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options)
    : ProcessGroup(rank, size), options_(std::move(options)) {
  DPAR_CHECK(size >= 1 && rank >= 0 && rank < size, "make_nccl_group: rank ", rank,
             " is outside a world of size ", size);
  DPAR_CHECK(options_.timeout.count() > 0, "make_nccl_group: the timeout must be positive, got ",
             options_.timeout.count(), " ms");
  std::string name = "nccl/local";  // a world of one
  if (size > 1) {
    DPAR_CHECK(store != nullptr, "make_nccl_group: a world of ", size, " needs a store");
    const int64_t instance = store->add("nccl/instances/" + std::to_string(rank), 1);
    name = "nccl/" + std::to_string(instance);
    store_ = std::make_shared<PrefixStore>(name, store);
    // DETAIL checks compare every rank's call before it runs; fingerprints are tiny host data,
    // so a Gloo group on the same store carries them.
    if (options_.debug_detail) detail_group_ = make_gloo_group(store_, rank, size, options_);
  }
  recorder_ = std::make_unique<FlightRecorder>(name, "nccl", rank, size);
  heartbeat_ = std::make_unique<ProgressHeartbeat>(
      store_, rank, size,
      ProgressHeartbeat::Stall{options_.stall_warning, name, options_.log,
                               [this](int64_t seq) { return recorder_->describe(seq); }});
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

ProcessGroupNccl::~ProcessGroupNccl() {
  // Let the watchdog see the outstanding collectives finish (or time out and abort).
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto deadline = Clock::now() + options_.timeout;
    while (!outstanding_.empty() && failed_.empty() && Clock::now() < deadline) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
    }
    stop_ = true;
  }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  const bool abort = !failed_.empty() || !outstanding_.empty();
  outstanding_.clear();
  for (auto& [device, c] : comms_) {
    if (c->comm != nullptr && !aborted_) {
      (void)cudaSetDevice(device);
      if (abort || !finalized(c->comm, options_.timeout)) {
        (void)ncclCommAbort(c->comm);
      } else {
        (void)ncclCommDestroy(c->comm);
      }
    }
    // The stream stays (cuda::communication_stream): buffers recorded on it are freed later.
    if (c->ready != nullptr) (void)cudaEventDestroy(c->ready);
  }
  comms_.clear();
  detail_group_.reset();
  heartbeat_.reset();
}

std::string ProcessGroupNccl::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void ProcessGroupNccl::throw_if_failed(const CollectiveInfo& info) {
  const std::string failure = this->failure();
  DPAR_CHECK(failure.empty(), info.describe(), " on rank ", rank_,
             " cannot run: the nccl group failed earlier: ", failure);
}

ProcessGroupNccl::Comm& ProcessGroupNccl::comm_for(Device device, const CollectiveInfo& info) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = comms_.find(device.index);
  if (found != comms_.end()) return *found->second;
  // Every rank creates its n-th communicator of this group for its n-th device in use.
  const std::string key = "comm/" + std::to_string(comms_created_++);
  lock.unlock();

  ncclUniqueId id;
  if (rank_ == 0) {
    call_nccl(nullptr, info, "ncclGetUniqueId", [&] { return ncclGetUniqueId(&id); });
    if (store_) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store_->set(key, Bytes(bytes, bytes + sizeof(id)));
    }
  } else {
    Bytes bytes;
    try {
      bytes = store_->get(key);
    } catch (const Error& e) {
      DPAR_FAIL(info.describe(), " #", info.seq, " on rank ", rank_, " (", device.str(),
                ", nccl): rank 0's NCCL id did not arrive through the store: ", e.what());
    }
    DPAR_CHECK(bytes.size() == sizeof(id), "make_nccl_group: rank ", rank_,
               ": the NCCL id in the store has ", bytes.size(), " bytes, expected ", sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }

  auto c = std::make_unique<Comm>();
  c->device = device.index;
  cuda::DeviceGuard guard(device);
  // Non-blocking: initialisation returns at once and is polled, so a rank that never joins
  // ends in a timeout error instead of a hang inside ncclCommInitRank.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t result = ncclCommInitRankConfig(&c->comm, size_, id, rank_, &config);
  const auto deadline = Clock::now() + options_.timeout;
  while (result == ncclInProgress && c->comm != nullptr) {
    if (Clock::now() >= deadline) {
      (void)ncclCommAbort(c->comm);
      DPAR_FAIL(info.describe(), " #", info.seq, " timed out after ",
                format_duration(options_.timeout), " on rank ", rank_, " (world size ", size_,
                ", nccl) while connecting the NCCL communicator of ", device.str(), "; ",
                heartbeat_->describe_laggards(info.seq));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)ncclCommGetAsyncError(c->comm, &result);
  }
  if (result != ncclSuccess) {
    if (c->comm != nullptr) (void)ncclCommAbort(c->comm);
    DPAR_FAIL(info.describe(), " #", info.seq, " failed on rank ", rank_, " (world size ", size_,
              ", nccl): cannot create the NCCL communicator of ", device.str(), ": ",
              nccl_error_text(result));
  }
  c->stream = cuda::communication_stream(device.index);
  cuda::check(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming), "cudaEventCreate");
  lock.lock();
  Comm& slot = *c;
  comms_[device.index] = std::move(c);
  return slot;
}

void ProcessGroupNccl::call_nccl(ncclComm_t comm, const CollectiveInfo& info, const char* name,
                                 const std::function<ncclResult_t()>& nccl_call) {
  ncclResult_t result = ncclSuccess;
  {
    std::lock_guard<std::timed_mutex> use(comm_use_mutex_);
    if (aborting_) throw_if_failed(info);
    result = nccl_call();
  }
  const auto deadline = Clock::now() + options_.timeout;
  while (result == ncclInProgress && comm != nullptr) {
    if (Clock::now() >= deadline) {
      fail(failure_line(info, std::string(name) + " did not return", /*timed_out=*/true));
      throw_if_failed(info);
    }
    std::this_thread::yield();
    std::lock_guard<std::timed_mutex> use(comm_use_mutex_);
    // Aborted by the watchdog meanwhile: the communicator is gone; report the group's failure.
    if (aborting_) throw_if_failed(info);
    (void)ncclCommGetAsyncError(comm, &result);
  }
  if (result == ncclSuccess) return;
  fail(failure_line(info, std::string(name) + ": " + nccl_error_text(result), false));
  throw_if_failed(info);
}

std::shared_ptr<Work> ProcessGroupNccl::run(CollectiveInfo info, Device device,
                                            const std::vector<Tensor>& used, const Body& body,
                                            bool async_op) {
  std::unique_lock<std::mutex> issuing(issue_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    info.seq = next_seq_++;
  }
  throw_if_failed(info);
  recorder_->enqueued(info);
  heartbeat_->entered(info.seq);
  if (detail_group_) check_fingerprints(info);
  cuda::DeviceGuard guard(device);
  Comm& c = comm_for(device, info);
  cudaStream_t producer = cuda::current_stream(device.index);
  cuda::check(cudaEventRecord(c.ready, producer), "cudaEventRecord");
  cuda::check(cudaStreamWaitEvent(c.stream, c.ready, 0), "cudaStreamWaitEvent");
  {
    // Flattening copies and temporaries made by body run (and are freed) on the comm stream.
    cuda::StreamGuard on_comm(device.index, c.stream);
    recorder_->started(info.seq);  // enqueued on the stream: the GPU runs it when it gets there
    body(c.comm, c.stream);
  }
  for (const Tensor& t : used) {
    if (t.defined() && t.storage() && t.numel() > 0) {
      cuda::record_stream(t.storage()->data(), c.stream);
    }
  }
  cudaEvent_t end = nullptr;
  cuda::check(cudaEventCreateWithFlags(&end, cudaEventDisableTiming), "cudaEventCreate");
  auto work = std::make_shared<NcclWork>(shared_from_this(), std::move(info), device.index, end);
  cuda::check(cudaEventRecord(end, c.stream), "cudaEventRecord");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outstanding_.push_back(work);
  }
  issuing.unlock();
  if (!async_op) work->wait();
  return work;
}

void ProcessGroupNccl::check_fingerprints(const CollectiveInfo& info) {
  Fingerprint mine = make_fingerprint(info, size_);
  std::vector<Fingerprint> all(static_cast<size_t>(size_));
  std::vector<Tensor> outputs;
  for (Fingerprint& fp : all) {
    outputs.push_back(Tensor::from_blob(&fp, {static_cast<int64_t>(sizeof(fp))}, DType::u8));
  }
  Tensor input = Tensor::from_blob(&mine, {static_cast<int64_t>(sizeof(mine))}, DType::u8);
  detail_group_->allgather(outputs, input, /*async_op=*/false);
  const std::string mismatch = find_mismatch(all);
  DPAR_CHECK(mismatch.empty(), mismatch, " (DPAR_DEBUG=DETAIL, nccl group, reported on rank ",
             rank_, ")");
}

// ---- failures ----------------------------------------------------------------------------------

std::string ProcessGroupNccl::failure_line(const CollectiveInfo& info, const std::string& what,
                                           bool timed_out) {
  std::string line = info.describe() + " #" + std::to_string(info.seq);
  line += timed_out ? " timed out after " + format_duration(options_.timeout) : " failed";
  line += " on rank " + std::to_string(rank_) + " (world size " + std::to_string(size_) + ", nccl)";
  if (!what.empty()) line += ": " + what;
  line += "; " + heartbeat_->describe_laggards(info.seq);
  return line + recorder_->record_failure(info, timed_out);
}

void ProcessGroupNccl::abort(const std::string& why) {
  fail("rank " + std::to_string(rank_) + " aborted the nccl group: " + why);
}

void ProcessGroupNccl::fail(const std::string& line) {
  std::vector<ncclComm_t> to_abort;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_.empty()) return;
    failed_ = line;
    aborting_ = true;
    if (!aborted_) {
      aborted_ = true;
      for (auto& [device, c] : comms_) to_abort.push_back(c->comm);
    }
  }
  // Aborting releases kernels that wait for a peer which will never come. It frees the
  // communicators: wait until the issuing thread is out of NCCL (it makes no call or poll
  // after aborting_), but not forever, since a wedged call must not hang the abort.
  if (!to_abort.empty()) {
    std::unique_lock<std::timed_mutex> use(comm_use_mutex_, std::defer_lock);
    (void)use.try_lock_for(std::chrono::seconds(10));
    for (ncclComm_t comm : to_abort) (void)ncclCommAbort(comm);
  }
  watchdog_cv_.notify_all();
}

void ProcessGroupNccl::watchdog_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (!failed_.empty()) {
      outstanding_.clear();
      continue;
    }
    // Oldest first: the first unfinished collective is the one that is stuck.
    std::shared_ptr<NcclWork> stuck;
    std::string cuda_error;
    while (!outstanding_.empty()) {
      const cudaError_t state = cudaEventQuery(outstanding_.front()->end());
      if (state == cudaSuccess) {
        recorder_->ended(outstanding_.front()->info().seq, true);
        heartbeat_->completed(outstanding_.front()->info().seq);
        outstanding_.pop_front();
        continue;
      }
      if (state == cudaErrorCudartUnloading) {  // process exit: nothing left to watch
        outstanding_.clear();
        break;
      }
      if (state != cudaErrorNotReady) {
        stuck = outstanding_.front();
        cuda_error = std::string(cudaGetErrorName(state)) + ": " + cudaGetErrorString(state);
      } else if (Clock::now() - outstanding_.front()->issued() > options_.timeout) {
        stuck = outstanding_.front();
      }
      break;
    }
    std::string async_error;
    for (auto& [device, c] : comms_) {
      ncclResult_t result = ncclSuccess;
      if (ncclCommGetAsyncError(c->comm, &result) == ncclSuccess && result != ncclSuccess &&
          result != ncclInProgress) {
        async_error = "NCCL reported " + nccl_error_text(result) +
                      " on cuda:" + std::to_string(device) +
                      " (a peer may have exited or lost its network)";
        break;
      }
    }
    if (!stuck && async_error.empty()) continue;
    // Composing the line reads the store (laggards); do it without the lock.
    lock.unlock();
    CollectiveInfo info;
    if (stuck) info = stuck->info();
    const bool timed_out = stuck && cuda_error.empty() && async_error.empty();
    const std::string what = !async_error.empty() ? async_error : cuda_error;
    fail(stuck ? failure_line(info, what, timed_out)
               : "nccl group on rank " + std::to_string(rank_) + " failed: " + async_error);
    // The aborted kernels let this rank's streams run on with buffers the peers never filled;
    // training on would silently diverge from the other ranks, and the training thread may
    // not call the group again for a long time. Like PyTorch's default NCCL error handling,
    // end the process with the failure line, and the launcher tears the job down. (A failure
    // on the issuing thread is thrown instead, and reported once by whoever catches it.)
    std::fflush(stdout);
    std::fprintf(stderr, "dpar: %s\n", failure().c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

}  // namespace dpar::dist::detail

namespace dpar::cuda {

std::shared_ptr<dist::ProcessGroup> make_nccl_group(std::shared_ptr<dist::Store> store, int rank,
                                                    int size,
                                                    const dist::ProcessGroupOptions& options) {
  return std::make_shared<dist::detail::ProcessGroupNccl>(std::move(store), rank, size, options);
}

}  // namespace dpar::cuda
