#pragma once
// dpar-launch's command line: `dpar-launch [flags] <program> [args...]`. Flags follow
// dpar::Flags (--log_dir == --log-dir, --name=value or --name value); the first argument that
// is not a flag is the program, and everything after it belongs to the program.
#include <cstdint>
#include <string>
#include <vector>

namespace dpar::launch {

struct Options {
  std::string ips = "127.0.0.1";
  std::string host;        // this node's address among the nodes (skips auto-detection)
  int64_t node_rank = -1;  // this node's index among the nodes; -1: detect
  std::string gpus;        // "0,1": one process per GPU
  int64_t nproc_per_node = 1;
  std::string hostfile;
  std::string rank_table;
  std::string log_dir = "log";  // "": no log files, every process echoes to the console
  int64_t start_port = 6070;
  std::string master;  // ip:port of the store; default derived (see plan.h)
  // torchrun's spellings: --master_addr/--master_port make up --master (either alone keeps the
  // other part's default); --nnodes is a fixed node count that must match the node list;
  // --standalone is one node on loopback with free ports found by the launcher.
  std::string master_addr;
  int64_t master_port = 0;
  int64_t nnodes = 0;  // 0: not given
  // Elastic jobs (--nnodes=MIN:MAX with MIN < MAX, or any --nnodes with --rdzv_endpoint): the
  // members meet on a rendezvous store and re-form the group when nodes leave or join
  // (dpar/distributed/elastic.h). max_nodes is 0 for a fixed job.
  int64_t min_nodes = 0;
  int64_t max_nodes = 0;
  std::string rdzv_backend = "dpar";  // or "etcd": the store is an etcd cluster (no host here)
  std::string rdzv_endpoint;      // dpar: host:port, whose node hosts the store; etcd: ip:port,...
  std::string rdzv_id;            // the job id; empty: derived from the endpoint
  double elastic_timeout = 30.0;  // seconds a round waits below MIN nodes, then the job fails
  bool elastic() const { return max_nodes > 0; }
  bool standalone = false;
  std::string job_id;  // default derived from the master endpoint
  std::string run_mode = "collective";
  int64_t max_restarts = 0;
  double grace_period = 3.0;      // seconds between SIGTERM and SIGKILL when stopping workers
  std::string cpu_bind = "none";  // or "cores" (cpu_binding.h)

  // --run_mode=ps (parameter-server mode); see plan.h for how they combine.
  std::string servers;   // "ip:port,ip:port": the servers, server id = position
  std::string trainers;  // "ip,ip" (or ip:port, port unused): one trainer per entry
  int64_t server_num = 0;
  int64_t trainer_num = 0;
  std::string job_token;              // "": DPAR_JOB_TOKEN, else generated or derived
  double server_stop_timeout = 30.0;  // seconds servers get to exit after all trainers did

  bool ips_given = false;
  bool gpus_given = false;
  bool nproc_given = false;
  bool servers_given = false;
  bool trainers_given = false;
  bool server_num_given = false;
  bool trainer_num_given = false;
  bool job_token_given = false;
  bool server_stop_timeout_given = false;
  bool start_port_given = false;
  bool ps_mode() const { return run_mode == "ps"; }
  std::vector<std::string> command;  // program and its arguments
};

// Parses and checks the flags on their own (no files, no network); throws FlagError.
Options parse_options(const std::vector<std::string>& args);

}  // namespace dpar::launch
