#pragma once
// init_parallel_env(): one call that turns a process started by dpar-launch (or torchrun,
// paddle.distributed.launch, Slurm's srun, Open MPI's mpirun) into a rank of the job. It reads
// the environment, starts the store (rank 0 hosts it), and creates the default Group. Without
// any launcher environment it is a world of one that needs no network.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/process_group.h"

namespace dpar::dist {

struct ParallelEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::vector<std::string> endpoints;  // one ip:port per rank, when the launcher gave them
  std::string current_endpoint;
  std::string job_id = "default";
  std::string device = "cpu";   // "cpu" or "gpu:<n>"
  std::string source = "none";  // dpar-launch | torchrun | paddle | slurm | openmpi | none
};

// Reads a ParallelEnv from environment variables (a pure function of env, for tests).
// Precedence: DPAR_* (dpar-launch), then torchrun's RANK/WORLD_SIZE/..., PaddlePaddle's
// PADDLE_*, Slurm's SLURM_*, Open MPI's OMPI_COMM_WORLD_*. Inconsistent values (rank >=
// world size, endpoint count != world size, missing master) are a dpar::Error saying which
// variables disagree.
ParallelEnv parse_parallel_env(const std::map<std::string, std::string>& env);
std::map<std::string, std::string> current_environment();

struct InitOptions {
  Millis connect_timeout{std::chrono::minutes(5)};  // waiting for rank 0's store
  ProcessGroupOptions group = ProcessGroupOptions::from_env();
  // The collective backend for CUDA tensors, as torch's init_process_group(backend=...):
  // "nccl" or "gloo" (through host memory); empty keeps group.cuda_backend (nccl unless
  // DPAR_DIST_BACKEND says otherwise). CPU tensors always use Gloo.
  std::string backend;
};

// The state behind init_parallel_env(): the store server (rank 0 hosts it), this rank's store
// client and the default Group. The free functions below use one process-wide instance;
// tests and embedders may create several, e.g. one per thread acting as a rank. A world of
// one has no store and a group of one (no network at all: its collectives return their input).
// Construction blocks until every rank has joined (a barrier) and throws dpar::Error naming
// the master endpoint on failure.
class ParallelContext {
 public:
  explicit ParallelContext(const ParallelEnv& env, const InitOptions& options = {});
  ~ParallelContext();
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  const ParallelEnv& env() const { return env_; }
  const std::shared_ptr<Store>& store() const { return store_; }  // null for a world of one
  const std::shared_ptr<Group>& group() const { return group_; }  // size 1 for a world of one
  void barrier();                                                 // no-op for a world of one
  // Drops the group and the store client; rank 0 first waits (bounded) until every rank has
  // called destroy() so the store outlives its last user, then stops the server. Idempotent.
  void destroy();

 private:
  ParallelEnv env_;
  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Group> group_;
};

// Initialises this process as a rank of the job described by the environment.
void init_parallel_env(const InitOptions& options = {});
// The same from an explicit description (tests; embedding).
void init_parallel_env(const ParallelEnv& env, const InitOptions& options = {});
bool is_initialized();
// Throws dpar::Error when the environment says this process is one rank of a larger job (a
// launcher started it: DPAR_WORLD_SIZE, WORLD_SIZE, ... > 1) but init_parallel_env() has not
// been called, naming the variable and the call: `who` (DataParallel, DistributedSampler)
// would otherwise run alone as rank 0 of 1. Parameter-server processes (TRAINING_ROLE) and
// single processes pass.
void require_init_under_launcher(const char* who);
int get_rank();        // 0 when not initialised
int get_world_size();  // 1 when not initialised
int get_local_rank();
const ParallelEnv& parallel_env();
Group& default_group();                      // throws if not initialised
std::shared_ptr<Group> default_group_ptr();  // null if not initialised
void barrier();
void destroy();  // tears down the default group and the store (idempotent)

}  // namespace dpar::dist
