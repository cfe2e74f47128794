#pragma once
// ProcessGroupNccl: the GPU collective backend (CUDA builds only).
//
// Calls run on the caller's thread and only enqueue GPU work; nothing waits on the host. Each
// device has one NCCL communicator and one high-priority communication stream, both created
// lazily on the first collective with a tensor on that device (the unique id travels through
// the store, so every rank must issue its first collective per device in the same order). A
// collective:
//   1. records an event on the caller's current stream (the producer: backward kernels, the
//      bucket copy) and makes the communication stream wait on it, so it reads finished data;
//   2. runs on the communication stream (fusing several or non-contiguous tensors into one
//      flat buffer there), so it overlaps whatever the caller enqueues next;
//   3. record_stream's every tensor it touched on the communication stream, so the caching
//      allocator does not hand their memory to anyone before the collective is done;
//   4. records an end event. Work::wait() makes the caller's current stream wait on it (no
//      host synchronisation); a wait with a timeout, is_completed() and barrier() do block.
// A watchdog thread checks the outstanding collectives and the communicators: a collective
// that exceeds the group timeout, or an asynchronous NCCL error (a peer died, a socket
// closed), is one line naming op, rank, device, shape and the ranks that have not arrived.
// The watchdog prints it, aborts every communicator (ncclCommAbort, which releases kernels
// waiting for a peer) and ends the process with exit code 1, as PyTorch's default NCCL error
// handling does: the streams would otherwise run on with buffers the peers never filled. A
// failing NCCL call on the issuing thread throws that line instead, and so does every later
// collective or wait on the group.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distributed/collective_check.h"
#include "distributed/flight_recorder.h"
#include "distributed/progress_heartbeat.h"
#include "dpar/distributed/process_group.h"

namespace dpar::dist::detail {

class NcclWork;

class ProcessGroupNccl final : public ProcessGroup,
                               public std::enable_shared_from_this<ProcessGroupNccl> {
 public:
  // Rendezvous keys live under "nccl/<k>" of store (k: this rank's k-th NCCL group on the
  // store). A world of one needs no store (it may be null).
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  // Waits (bounded by the timeout) for the outstanding collectives, then destroys the
  // communicators; aborts them instead when the group failed or the wait timed out.
  ~ProcessGroupNccl() override;

  std::string backend_name() const override { return "nccl"; }
  std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors, ReduceOp op, bool async_op) override;
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root, bool async_op) override;
  std::shared_ptr<Work> allgather(std::vector<Tensor> outputs, Tensor input,
                                  bool async_op) override;
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op,
                                       bool async_op) override;
  // A one-element all-reduce on the device of the group's first communicator (cuda:<current>
  // when there is none yet), waited for on the host.
  std::shared_ptr<Work> barrier(bool async_op) override;
  // ncclCommAbort on every communicator (fail()), which releases kernels waiting for a peer.
  void abort(const std::string& why) override;

  // The failure line once the group failed (watchdog or an NCCL call), else empty.
  std::string failure() const;

 private:
  friend class NcclWork;
  struct Comm {
    int device = 0;
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t ready = nullptr;  // reused: "the producer's work so far", recorded per call
  };
  using Body = std::function<void(ncclComm_t, cudaStream_t)>;

  // Steps 1-4 above around body, which issues the NCCL calls (and any flattening copies) for
  // the collective on the communication stream.
  std::shared_ptr<Work> run(CollectiveInfo info, Device device, const std::vector<Tensor>& used,
                            const Body& body, bool async_op);
  Comm& comm_for(Device device, const CollectiveInfo& info);
  // Makes an NCCL call on comm and polls ncclInProgress (non-blocking communicators) until done,
  // bounded by the timeout. The call and each poll hold comm_use_mutex_ and are not made once
  // the group is aborting, so fail()'s ncclCommAbort, which frees the communicator, never
  // runs while this thread is inside NCCL with it. Failures mark the group failed and throw.
  void call_nccl(ncclComm_t comm, const CollectiveInfo& info, const char* name,
                 const std::function<ncclResult_t()>& nccl_call);
  void check_fingerprints(const CollectiveInfo& info);
  void throw_if_failed(const CollectiveInfo& info);
  // Records the first failure and aborts every communicator; later waits and collectives throw
  // it. Safe from any thread except one holding comm_use_mutex_; later failures change nothing.
  void fail(const std::string& line);
  std::string failure_line(const CollectiveInfo& info, const std::string& what, bool timed_out);
  void watchdog_loop();

  ProcessGroupOptions options_;
  std::shared_ptr<Store> store_;  // this group's prefixed view (null for a world of one)
  std::unique_ptr<ProgressHeartbeat> heartbeat_;
  std::unique_ptr<FlightRecorder> recorder_;
  std::shared_ptr<ProcessGroup> detail_group_;  // gloo, exchanges DPAR_DEBUG=DETAIL fingerprints

  // Held while a collective is issued: NCCL needs every rank to issue in one order, and the
  // sequence numbers, communicator creation and stream protocol must not interleave.
  std::mutex issue_mutex_;
  // Held by the issuing thread inside an NCCL call or poll on a communicator in comms_, and by
  // fail() while it aborts them. Non-blocking communicators return at once, so it is held
  // briefly; fail() waits for it a bounded time (a wedged call must not hang the abort).
  std::timed_mutex comm_use_mutex_;
  std::atomic<bool> aborting_{false};           // set with failed_; calls and polls stop
  mutable std::mutex mutex_;                    // guards everything below
  std::map<int, std::unique_ptr<Comm>> comms_;  // by device index
  int64_t next_seq_ = 1;
  int comms_created_ = 0;
  std::deque<std::shared_ptr<NcclWork>> outstanding_;  // issued, not yet seen complete
  std::string failed_;
  bool aborted_ = false;
  bool stop_ = false;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;
};

// What Work::wait() and the watchdog see of one collective.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<ProcessGroupNccl> group, CollectiveInfo info, int device,
           cudaEvent_t end);
  ~NcclWork() override;
  bool is_completed() override;
  // Makes the caller's current stream wait for the collective; with a timeout, waits on the
  // host instead, at most that long. Throws the group's failure.
  void wait(Millis timeout = Millis(0)) override;

  const CollectiveInfo& info() const { return info_; }
  int device() const { return device_; }
  cudaEvent_t end() const { return end_; }
  std::chrono::steady_clock::time_point issued() const { return issued_; }

 private:
  std::weak_ptr<ProcessGroupNccl> group_;
  const CollectiveInfo info_;
  const int device_;
  cudaEvent_t end_;
  const std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
};

}  // namespace dpar::dist::detail
