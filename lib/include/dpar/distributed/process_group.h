#pragma once
// Collectives. A ProcessGroup is one backend (Gloo for CPU tensors; NCCL for CUDA tensors in
// CUDA builds) over a fixed set of ranks. Group routes each call to the backend for the
// tensors' device, so CPU and GPU collectives coexist in one build and one job.
//
// Every collective returns a Work whose wait() rethrows any failure. By default a collective is
// asynchronous: it runs on the group's communication thread while the caller goes on. With
// async_op = false (torch's async_op=False, paddle's sync_op=True) the call itself blocks until
// the collective is done, throws its failure, and returns a completed Work; when the group is
// idle it runs on the calling thread, so no thread hand-off is paid. Every
// collective has a timeout (default 30 min; DPAR_TIMEOUT=<seconds> or the options); a timeout
// error names the op, this rank, the tensor shape, and the ranks that have not arrived when
// known. With DPAR_DEBUG=DETAIL each collective first checks that all ranks issue the same op
// with the same shapes and dtypes, and reports a mismatch instead of hanging.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dpar/distributed/store.h"
#include "dpar/tensor/tensor.h"

namespace dpar::dist {

// Avg is the sum divided by the world size; for i64 it truncates toward zero. f16 and bf16 are
// combined in f32 and rounded to their format at each step of the reduction.
enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  // Blocks until done; throws dpar::Error if the collective failed, or if timeout passes
  // first. A zero timeout waits for the collective itself, which the group's timeout bounds
  // (the error then is the collective's own timeout error, naming op, ranks and shape).
  virtual void wait(Millis timeout = Millis(0)) = 0;
};

struct ProcessGroupOptions {
  Millis timeout{std::chrono::minutes(30)};
  bool debug_detail = false;  // DPAR_DEBUG=DETAIL: cross-rank op/shape check before each op
  // DPAR_DEBUG=INFO (or DETAIL): each rank logs how its group's collectives travel (shared
  // memory, tcp, or both) once the group is connected.
  bool debug_info = false;
  // A collective still running this long after it started gets one warning line naming the
  // ranks that have not arrived (DPAR_STALL_WARNING=<seconds>; 0 turns it off). It goes on
  // until the timeout.
  Millis stall_warning{std::chrono::seconds(60)};
  // Address this rank's transport binds to (Gloo TCP); empty: the address used to reach the
  // store host, or loopback for a local job.
  std::string bind_address;
  // The backend for CUDA tensors: "nccl" (the default; CUDA builds), or "gloo", which copies
  // them through host memory (slower; runs where NCCL cannot, e.g. several ranks on one GPU).
  // CPU tensors always use Gloo.
  std::string cuda_backend = "nccl";
  // Where the group's warnings go (a stranger that connected to a rendezvous port, a retried
  // rendezvous); empty: stderr, as "dpar: <line>".
  std::function<void(const std::string&)> log;
  // Asked every fraction of a second while the Gloo transport connects: a non-empty answer
  // ends the connect with an error naming it, instead of waiting out the timeout for a peer
  // that will not come. Group sets it for the backends it creates, so Group::abort (e.g. an
  // elastic job's, after a member's heartbeat stopped) stops a connect in progress too.
  std::function<std::string()> cancel_connect;
  // CPU collectives through shared memory between ranks of one host (same machine and network
  // namespace), bitwise equal to the TCP ring: all of them through one segment when every rank
  // is on this host, else allreduce, reduce_scatter and allgather on the ring with its hops
  // inside a host through shared memory and those between hosts through TCP (broadcast and
  // barrier then stay on Gloo). DPAR_SHM=0 turns it off.
  bool shared_memory = true;
  // Which host this rank runs on, as the shared-memory transport compares them; empty: detected
  // (boot id, hostname, network and pid namespaces). Ranks that are threads of one process (the
  // tests) set it to stand for ranks on several hosts.
  std::string host_identity;
  // Reads DPAR_TIMEOUT and DPAR_STALL_WARNING (seconds), DPAR_DEBUG, DPAR_DIST_BACKEND
  // (nccl or gloo: the cuda_backend) and DPAR_SHM (1 or 0) from the environment.
  static ProcessGroupOptions from_env();
};

// Where allreduce splits `numel` elements of `element_size` bytes into size chunks: chunk r
// is [bounds[r], bounds[r + 1]). Boundaries fall on 64-byte multiples (a chunk starts aligned
// for vector kernels; a chunk may be empty when there are fewer 64-byte blocks than ranks). A
// Gloo reduce_scatter given these chunks adds every element in the same order as a Gloo
// allreduce of the whole buffer, so sharded DataParallel is bitwise equal to unsharded.
std::vector<int64_t> allreduce_chunk_bounds(int64_t numel, int size, size_t element_size);

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;

  // In place on each tensor (all ranks pass tensors of equal shapes and dtypes). Several
  // tensors are reduced as one fused operation.
  virtual std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors, ReduceOp op = ReduceOp::Sum,
                                          bool async_op = true) = 0;
  // In place: root's values are copied to every rank.
  virtual std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root = 0,
                                          bool async_op = true) = 0;
  // outputs[r] receives rank r's input; outputs has size() tensors of input's dtype. Their
  // sizes may differ between positions (uneven splits of a buffer, as sharded DataParallel's
  // parameter slices); the input has as many elements as outputs[rank()].
  virtual std::shared_ptr<Work> allgather(std::vector<Tensor> outputs, Tensor input,
                                          bool async_op = true) = 0;
  // output = reduction over ranks of inputs[rank()] (inputs has size() tensors; their sizes
  // may differ between positions, so uneven splits of a buffer are fine).
  virtual std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs,
                                               ReduceOp op = ReduceOp::Sum,
                                               bool async_op = true) = 0;
  virtual std::shared_ptr<Work> barrier(bool async_op = true) = 0;

  // Breaks this group's connections so that a collective in flight (one waiting for a rank that
  // died, stopped or was cut off) fails now instead of at the timeout, with `why` in its error;
  // the group is unusable afterwards. Elastic recovery (elastic.h) calls it from another
  // thread; safe to call more than once and while collectives run.
  virtual void abort(const std::string& why) = 0;

 protected:
  int rank_;
  int size_;
};

// Creates the Gloo process group (TCP transport) for CPU tensors, rendezvousing through store
// (under "gloo/<k>" for this rank's k-th Gloo group, so every rank must create its groups in
// the same order). A world of one needs no store (it may be null) and no network.
std::shared_ptr<ProcessGroup> make_gloo_group(
    std::shared_ptr<Store> store, int rank, int size,
    const ProcessGroupOptions& options = ProcessGroupOptions::from_env());

// Routes collectives by tensor device: CPU -> Gloo, CUDA -> NCCL (options.cuda_backend; in a
// build without CUDA a CUDA tensor is a dpar::Error naming the device) or Gloo through host
// memory. Backends are created on first use from the shared store, thread-safely; an NCCL
// group's communicators are created on its first collective per device.
class Group {
 public:
  Group(std::shared_ptr<Store> store, int rank, int size,
        ProcessGroupOptions options = ProcessGroupOptions::from_env());
  int rank() const { return rank_; }
  int size() const { return size_; }
  ProcessGroup& backend_for(Device device);
  std::shared_ptr<ProcessGroup> backend_ptr_for(Device device);

  std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors, ReduceOp op = ReduceOp::Sum,
                                  bool async_op = true);
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root = 0, bool async_op = true);
  std::shared_ptr<Work> allgather(std::vector<Tensor> outputs, Tensor input, bool async_op = true);
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs,
                                       ReduceOp op = ReduceOp::Sum, bool async_op = true);
  void barrier();  // on the CPU backend
  // Aborts every backend created so far (ProcessGroup::abort), stops one being connected, and
  // fails backends created afterwards: the group is unusable. Safe from any thread; does not
  // wait for a connect in progress.
  void abort(const std::string& why);
  const std::shared_ptr<Store>& store() const { return store_; }
  Millis timeout() const { return options_.timeout; }  // of every collective

 private:
  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  // Stores a backend just created; throws (after aborting it) when the group was aborted
  // meanwhile.
  void adopt(DeviceType type, const std::shared_ptr<ProcessGroup>& backend);
  std::string abort_reason() const;

  ProcessGroupOptions options_;
  // Held while a backend is created (a rendezvous with the other ranks: it may take long), so
  // each is created once. abort() never takes it.
  std::mutex create_mutex_;
  std::mutex mutex_;  // guards backends_; held only briefly
  // Why the group was aborted ("" until then), shared with the backends' cancel_connect,
  // which may outlive the group.
  struct AbortState;
  std::shared_ptr<AbortState> abort_state_;
  std::shared_ptr<ProcessGroup> backends_[kNumDeviceTypes];
};

// Every rank's string, in rank order (torch's all_gather_object for text): the lengths, then the
// bytes as one uneven u8 allgather on the group's CPU backend. Synchronous; every rank calls it.
std::vector<std::string> allgather_strings(Group& group, const std::string& mine);

}  // namespace dpar::dist
