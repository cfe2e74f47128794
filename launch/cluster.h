#pragma once
// The cluster description every node's launcher derives from the same flags or files, so all
// nodes agree on ranks and endpoints without talking to each other:
//   --ips=a,b [--gpus=0,1 | --nproc_per_node=N]   same process count on every node
//   --hostfile=F    Horovod/MPI lines "host slots=N" (or "host:N"); '#' starts a comment
//   --rank_table=F  MindSpore-style JSON: server_list[].server_id, device[].device_id/rank_id
// Ranks are numbered node by node (node 0's processes first) except in a rank table, which
// states them. Every builder throws FlagError (exit status 2) naming the input and the entry.
#include <string>
#include <vector>

namespace dpar::launch {

// What a process is in the job: a rank of a collective job, or a parameter server or a trainer
// of a ps job (--run_mode=ps).
enum class Role { kRank, kServer, kTrainer };

struct Process {
  int rank = 0;        // global rank; in ps mode only a position among all the job's processes
  int local_rank = 0;  // index among its node's processes
  std::string gpu;     // GPU id as the launcher's caller numbers it; empty: a CPU process
  Role role = Role::kRank;
  int role_id = 0;       // ps mode: global server id or trainer id
  int role_local = 0;    // ps mode: index among the node's processes of the same role
  std::string endpoint;  // ps servers: ip:port
};

// "rank 3", "server 1", "trainer 0": how messages name a process.
std::string process_name(const Process& proc);

// Its log file under --log_dir: workerlog.<local rank> for ranks, serverlog.<local server
// index> for servers and workerlog.<local trainer index> for trainers.
std::string log_file_name(const Process& proc);

struct Node {
  std::string host;            // as written in the input (an IP or, in files, a host name)
  std::string ip;              // IPv4 address the endpoints use
  std::vector<Process> procs;  // by local rank
  // The GPUs its processes use, each once, in first-use order (CUDA_VISIBLE_DEVICES). Fewer
  // than procs when ranks share GPUs (--nproc_per_node a multiple of --gpus).
  std::vector<std::string> gpus() const;
};

struct Cluster {
  std::vector<Node> nodes;
  std::string source;  // "--ips=a,b", "--hostfile=F" or "--rank_table=F" for error messages
  int world_size() const;
  int max_local_size() const;
};

// "0,1,3" -> {"0","1","3"}. Non-negative integers, no empty entries, no duplicates.
std::vector<std::string> parse_gpu_list(const std::string& text, const std::string& flag);

// One node per --ips entry (IPv4 literals); each runs one process per GPU in `gpus`, or `nproc`
// when that is more (process i on gpus[i % len]: ranks share GPUs), or `nproc` CPU processes
// when gpus is empty.
Cluster cluster_from_ips(const std::string& ips, const std::vector<std::string>& gpus, int nproc);

// `text` is the hostfile's content, `name` its path (for messages). A line without slots gets
// the default count (len(gpus), else nproc); with gpus, slots may not exceed len(gpus) and
// process i uses gpus[i].
Cluster cluster_from_hostfile(const std::string& text, const std::string& name,
                              const std::vector<std::string>& gpus, int nproc);

// `text` is the rank table's JSON. Ids may be strings ("0", as MindSpore writes them) or
// numbers. rank_id values must be exactly 0..N-1; within a node, local ranks follow rank_id.
Cluster cluster_from_rank_table(const std::string& text, const std::string& name);

// Reads a whole file; throws FlagError naming the flag when it cannot be read.
std::string read_text_file(const std::string& path, const std::string& flag);

}  // namespace dpar::launch
