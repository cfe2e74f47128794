#pragma once
// ProcessGroupGloo: the CPU collective backend over Gloo's TCP transport.
//
// Calls validate their arguments on the caller's thread (bad arguments throw at once), take
// the next sequence number and queue the collective; one communication thread per group runs
// the queue in issue order, so every rank runs the same collective at the same time, and
// completes the Work. A caller that waits (without a timeout) on a collective that has not
// started while the group is idle runs the queue up to it itself instead (one collective runs
// at a time either way, in issue order); a synchronous call (async_op = false) does not wake
// the communication thread at all. Every Gloo operation gets the group timeout; a timeout or
// transport failure marks the group failed (Gloo closes the connections of a context after a
// timeout), and later collectives fail at once with the first error. With debug_detail, each
// collective first exchanges fingerprints (collective_check.h) and fails on every rank on a
// mismatch, which leaves the group usable.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distributed/collective_check.h"
#include "distributed/flight_recorder.h"
#include "distributed/gloo/checked_ring.h"
#include "distributed/gloo/hybrid_ring.h"
#include "distributed/gloo/shm_collectives.h"
#include "distributed/progress_heartbeat.h"
#include "distributed/work_impl.h"
#include "dpar/distributed/process_group.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace dpar::dist::detail {

class ProcessGroupGloo final : public ProcessGroup,
                               public InlineRunner,
                               public std::enable_shared_from_this<ProcessGroupGloo> {
 public:
  // Rendezvous: this group's keys live under "gloo/<k>" of store, where k counts the Gloo
  // groups this rank created on the store (so every rank's k-th group meets the others' k-th
  // group). A world of one needs no store (it may be null) and no network.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  // Runs the collectives still queued (each is bounded by the timeout), then stops.
  ~ProcessGroupGloo() override;

  std::string backend_name() const override { return "gloo"; }
  // Overrides repeat no default arguments: calls go through ProcessGroup's.
  std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors, ReduceOp op, bool async_op) override;
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root, bool async_op) override;
  std::shared_ptr<Work> allgather(std::vector<Tensor> outputs, Tensor input,
                                  bool async_op) override;
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op,
                                       bool async_op) override;
  std::shared_ptr<Work> barrier(bool async_op) override;
  // Shuts down this rank's sockets to every peer (shutdown(2), not close: Gloo's event loop
  // still owns the descriptors): Gloo's loop reads end-of-file on each, fails the transfers
  // waiting on it, and the running collective fails with `why` at once; the peers see the
  // connection close as well.
  void abort(const std::string& why) override;

  void run_inline_until(const WorkImpl* work) override;

  const ProcessGroupOptions& options() const { return options_; }
  const std::string& bind_address() const { return bind_address_; }
  // How the collectives travel: "shared memory" (every rank on this host: all of them through
  // shm_collectives.h), "shared memory within hosts (k of n ring hops), tcp between them"
  // (allreduce, reduce_scatter and allgather on hybrid_ring.h; broadcast and barrier on Gloo) or
  // "tcp", and why not shared memory where it is not.
  std::string transport() const;

 private:
  struct PendingOp {
    std::shared_ptr<WorkImpl> work;
    std::vector<Tensor> tensors;  // allreduce/broadcast tensors, allgather outputs, r_s inputs
    Tensor single;                // allgather input, reduce_scatter output
  };

  // Queues the collective. async_op: wakes the communication thread and returns at once;
  // otherwise leaves the thread asleep and waits, so that an idle group runs the collective on
  // the caller's thread (a wake-up costs a context switch, hundreds of microseconds on a
  // loaded or virtualised machine), and returns the completed Work.
  std::shared_ptr<Work> enqueue(CollectiveInfo info, std::vector<Tensor> tensors, Tensor single,
                                bool async_op);
  void comm_loop();
  // Picks the shared-memory transport from every rank's host (a collective over the store).
  void connect_shared_memory();
  // The collective failed here: the ranks waiting for this one in shared memory (across its ring
  // hops, or in the one-host segment) fail too, now.
  void give_up_shared_memory(const std::string& why);
  void close_connections();  // drops the context (closing its sockets) and forgets the sockets
  std::string abort_reason();
  void execute(PendingOp& op);
  void check_fingerprints(const CollectiveInfo& info);
  std::string failure_message(const CollectiveInfo& info, const std::string& what, bool timed_out,
                              bool in_check, bool name_laggards = true);

  // Collective bodies (gloo_collectives.cpp); run on the communication thread.
  void run_allreduce(PendingOp& op);
  void run_broadcast(PendingOp& op);
  void run_allgather(PendingOp& op);
  void run_reduce_scatter(PendingOp& op);
  void run_barrier(PendingOp& op);
  // Their paths through shared memory (every rank on this host).
  void shm_reduce_scatter(const CollectiveInfo& info, const std::vector<Tensor>& inputs,
                          Tensor& output);
  void shm_allgather(const Tensor& input, std::vector<Tensor>& outputs,
                     const std::vector<size_t>& chunk_bytes);
  uint8_t* staging(size_t bytes);  // reused buffer for fused / non-contiguous tensors
  uint32_t tag(const CollectiveInfo& info) const {
    return static_cast<uint32_t>(info.seq % 0x7fffffff);
  }

  ProcessGroupOptions options_;
  std::string bind_address_;
  std::shared_ptr<Store> store_;  // this group's prefixed view
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<ShmCollectives> shm_;  // every rank on this host: collectives, else null
  RingLinks links_;                      // otherwise this rank's ring hops within its host, if any
  std::string no_shm_reason_;
  std::unique_ptr<ProgressHeartbeat> heartbeat_;
  std::unique_ptr<FlightRecorder> recorder_;

  // State of the thread running a collective (see running_).
  std::vector<uint64_t> staging_;  // uint64_t elements: aligned for every dtype
  RingScratch ring_scratch_;
  HybridScratch hybrid_scratch_;
  std::vector<Fingerprint> fingerprints_;
  // The collective this group is running, for the line written if Gloo's thread takes the
  // process down (gloo_terminate.h).
  std::atomic<const CollectiveInfo*> running_info_{nullptr};
  std::string failed_;  // first timeout / transport failure; the group is unusable after it

  // The connected pairs' sockets, for abort(). Emptied (under the mutex) before the context
  // closes them, so abort() never shuts down a descriptor number the process has reused.
  std::mutex sockets_mutex_;
  std::vector<int> pair_sockets_;
  std::string aborted_;  // abort()'s reason, guarded by sockets_mutex_

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<PendingOp> queue_;
  bool running_ = false;  // a thread (communication or waiting caller) is running a collective
  int64_t next_seq_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dpar::dist::detail
