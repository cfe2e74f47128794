#pragma once
// The launch plan: the cluster, which node this is, and the endpoints every node derives the
// same way from the same flags.
//
// Port scheme (L = the largest number of processes on any node, P = --start_port):
//   rank r on node n, local rank l:  endpoint  ip(n):P+l          (ports P .. P+L-1)
//   store (DPAR_MASTER):             ip(node of rank 0):P+L      (the port after that block)
// so the store never collides with a rank's endpoint, and a second job on the same nodes
// needs a --start_port outside P..P+L. --master=ip:port overrides the store's endpoint.
// The job id defaults to "dpar-<master ip>-<master port>", which every node computes alike.
//
// ps mode (--run_mode=ps): servers from --servers=ip:port,... (server id = position) or
// --server_num=N (ip:P .. ip:P+N-1 on the one --ips node); trainers from --trainers=ip,...
// (one per entry, trainer id = position; "ip:port" entries are accepted, the port is unused)
// or --trainer_num=M (on the --ips node). The nodes are the distinct addresses among the
// servers and then the trainers, in order of first appearance; a node runs its servers (by
// id) and then its trainers (by id). The job id defaults to "dpar-ps-<ip>-<port>" of server 0.
#include <string>
#include <vector>

#include "cluster.h"
#include "options.h"

namespace dpar::launch {

struct LaunchPlan {
  Cluster cluster;
  int node_rank = 0;  // index of this node in cluster.nodes
  int start_port = 6070;
  std::string master_ip;
  int master_port = 0;
  std::string job_id;
  std::vector<std::string> endpoints;  // ip:port by global rank
  std::vector<std::string> command;    // program (as given) and its arguments
  std::string program_path;            // resolved executable
  std::string gpu_source;  // "--gpus=0,1" or "--rank_table=F": where the GPU ids come from
  std::string log_dir;
  int max_restarts = 0;
  double grace_period = 3.0;
  bool bind_cpus = false;  // --cpu_bind=cores: each local process on its own CPUs

  // Elastic jobs (--nnodes=MIN:MAX): this node's processes only; the members meet at
  // rdzv_endpoint (job_id is --rdzv_id) and count min_members..max_members processes.
  bool elastic = false;
  std::string rdzv_backend = "dpar";  // dpar: a store on the endpoint's node; etcd: a cluster
  std::string rdzv_endpoint;
  int min_members = 0;
  int max_members = 0;
  double elastic_timeout = 30.0;

  // ps mode only (master and endpoints stay empty).
  bool ps_mode = false;
  std::vector<std::string> servers;  // ip:port by server id
  int trainers_num = 0;
  std::string job_token;  // set by the caller (choose_job_token) before the environments
  double server_stop_timeout = 30.0;

  const Node& node() const { return cluster.nodes[static_cast<size_t>(node_rank)]; }
  std::string master() const { return master_ip + ":" + std::to_string(master_port); }
  bool hosts_rank0() const;
  // ps mode: how many of this node's processes have `role`.
  int local_count(Role role) const;
  // ps mode: every trainer of the job runs on this node.
  bool all_trainers_local() const { return ps_mode && local_count(Role::kTrainer) == trainers_num; }
  // Local rank of the process echoed on the console when logs go to files: 0 in collective
  // mode; in ps mode the first local trainer, or the first local server on a servers-only node.
  int echo_local_rank() const;
};

// Builds the cluster from --ips/--hostfile/--rank_table, finds this node among
// `local_addresses` (unless --host/--node_rank say), assigns endpoints and checks they are
// distinct. Reads the hostfile/rank table; touches nothing else. Throws FlagError.
LaunchPlan make_plan(const Options& options, const std::vector<std::string>& local_addresses);

// Index of this node: --node_rank, else --host, else the one node whose address is among
// `local_addresses`. Throws FlagError saying which addresses were found.
int select_node(const Cluster& cluster, const std::string& host, int node_rank,
                const std::vector<std::string>& local_addresses);

// Binds each endpoint this node's processes will use (and the store's, on rank 0's node; in
// ps mode the local servers' endpoints); throws FlagError naming the first address that is
// taken.
void check_ports_free(const LaunchPlan& plan);

// ps mode, from ps_plan.cpp. The plan for --run_mode=ps (make_plan calls it).
LaunchPlan make_ps_plan(const Options& options, const std::vector<std::string>& local_addresses);

// "--servers=..." parsed: ip:port per server, normalised ("127.0.0.1:06070" -> ...:6070).
// Throws FlagError naming a malformed entry or a duplicate endpoint.
std::vector<std::string> parse_server_list(const std::string& text);
// "--trainers=..." parsed: the IPv4 address of each trainer.
std::vector<std::string> parse_trainer_list(const std::string& text);

// The ps job's token: `given` (--job_token, else the launcher's DPAR_JOB_TOKEN; "" when
// neither); else, when the whole job runs on this node, 32 random hex characters from
// /dev/urandom; else one derived from the job id (*derived is set: the caller warns that it
// is no secret).
std::string choose_job_token(const std::string& given, bool single_node, const std::string& job_id,
                             bool* derived);
// Hex of the 64-bit FNV-1a hash of "dpar-ps-token/" + job_id: the same on every node.
std::string derived_job_token(const std::string& job_id);

}  // namespace dpar::launch
