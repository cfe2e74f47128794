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
  std::string log_dir;
  int max_restarts = 0;
  double grace_period = 3.0;

  const Node& node() const { return cluster.nodes[static_cast<size_t>(node_rank)]; }
  std::string master() const { return master_ip + ":" + std::to_string(master_port); }
  bool hosts_rank0() const;
};

// Builds the cluster from --ips/--hostfile/--rank_table, finds this node among
// `local_addresses` (unless --host/--node_rank say), assigns endpoints and checks they are
// distinct. Reads the hostfile/rank table; touches nothing else. Throws FlagError.
LaunchPlan make_plan(const Options& options, const std::vector<std::string>& local_addresses);

// Index of this node: --node_rank, else --host, else the one node whose address is among
// `local_addresses`. Throws FlagError saying which addresses were found.
int select_node(const Cluster& cluster, const std::string& host, int node_rank,
                const std::vector<std::string>& local_addresses);

// Binds each endpoint this node's processes will use (and the store's, on rank 0's node);
// throws FlagError naming the first address that is taken.
void check_ports_free(const LaunchPlan& plan);

}  // namespace dpar::launch
