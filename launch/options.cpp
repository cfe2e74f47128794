#include "options.h"

#include <cstdlib>
#include <tuple>
#include <utility>

#include "address.h"
#include "dpar/core/flags.h"
#include "text.h"

namespace dpar::launch {
namespace {

[[noreturn]] void bad(const std::string& message) { throw FlagError("dpar-launch: " + message); }

// Flags of one mode given in the other: each is one line naming the flag.
void check_mode_flags(const Options& o) {
  if (!o.ps_mode()) {
    const std::pair<bool, const char*> ps_flags[] = {
        {o.servers_given, "--servers"},
        {o.trainers_given, "--trainers"},
        {o.server_num_given, "--server_num"},
        {o.trainer_num_given, "--trainer_num"},
        {o.job_token_given, "--job_token"},
        {o.server_stop_timeout_given, "--server_stop_timeout"}};
    for (const auto& [given, name] : ps_flags) {
      if (given) bad(std::string(name) + " needs --run_mode=ps (parameter-server mode)");
    }
    return;
  }
  if (o.cpu_bind == "cores") {
    bad("--cpu_bind=cores applies to collective jobs; --run_mode=ps leaves the placement of "
        "servers and trainers to the system");
  }
  const std::pair<bool, const char*> collective_flags[] = {{o.gpus_given, "--gpus"},
                                                           {!o.hostfile.empty(), "--hostfile"},
                                                           {!o.rank_table.empty(), "--rank_table"},
                                                           {o.nproc_given, "--nproc_per_node"},
                                                           {!o.master.empty(), "--master"}};
  for (const auto& [given, name] : collective_flags) {
    if (given) {
      bad(std::string(name) +
          " cannot be used with --run_mode=ps: ps mode runs CPU trainers described by "
          "--servers/--trainers or --server_num/--trainer_num");
    }
  }
}

// --nnodes=N, or torchrun's MIN:MAX (an elastic job; the caller sets the range).
int64_t parse_node_count(const std::string& text, int64_t* min_nodes = nullptr) {
  if (text.find(':') != std::string::npos) {
    const std::string min = text.substr(0, text.find(':')), max = text.substr(text.find(':') + 1);
    const int64_t low = parse_node_count(min), high = parse_node_count(max);
    if (low > high) bad("--nnodes=" + text + ": MIN is above MAX");
    if (min_nodes != nullptr) *min_nodes = low;
    return high;
  }
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < 1 || n > 4096) {
    bad("--nnodes=" + text + ": expected a number of nodes in 1..4096");
  }
  return n;
}

void check_ps(const Options& o) {
  const std::tuple<bool, int64_t, const char*, const char*> counts[] = {
      {o.server_num_given, o.server_num, "--server_num", "server"},
      {o.trainer_num_given, o.trainer_num, "--trainer_num", "trainer"}};
  for (const auto& [given, n, name, what] : counts) {
    if (given && n < 1) {
      bad(std::string(name) + "=" + std::to_string(n) + ": ps mode needs at least 1 " + what);
    }
    if (given && n > 4096) {
      bad(std::string(name) + "=" + std::to_string(n) + ": expected at most 4096");
    }
  }
  if (!o.servers_given && !o.server_num_given) {
    bad("--run_mode=ps needs at least 1 server and 1 trainer: give --servers=ip:port,... or "
        "--server_num=N");
  }
  if (!o.trainers_given && !o.trainer_num_given) {
    bad("--run_mode=ps needs at least 1 server and 1 trainer: give --trainers=ip,... or "
        "--trainer_num=M");
  }
  if (o.servers_given && trim(o.servers).empty()) {
    bad("--servers is empty (expected --servers=ip:port,ip:port)");
  }
  if (o.trainers_given && trim(o.trainers).empty()) {
    bad("--trainers is empty (expected --trainers=ip,ip: one entry per trainer)");
  }
  if (o.ips_given && o.servers_given && o.trainers_given) {
    bad("--ips is not used with --servers and --trainers (the nodes are their addresses); "
        "--ips names the node of --server_num/--trainer_num");
  }
  if (o.job_token_given && o.job_token.empty()) {
    bad("--job_token is empty (leave it out to use DPAR_JOB_TOKEN or a generated token)");
  }
  if (!(o.server_stop_timeout >= 0 && o.server_stop_timeout <= 86400)) {
    bad("--server_stop_timeout=" + std::to_string(o.server_stop_timeout) +
        ": expected 0..86400 seconds");
  }
}

// torchrun's vocabulary, checked against dpar's own flags for the same things.
void check_torchrun_flags(const Options& o) {
  if (!o.master.empty() && (!o.master_addr.empty() || o.master_port != 0)) {
    bad("--master and --master_addr/--master_port both give the store's endpoint; give one");
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    bad("--master_port=" + std::to_string(o.master_port) + ": expected a port in 1..65535");
  }
  if (o.nnodes < 0) bad("--nnodes=" + std::to_string(o.nnodes) + ": expected at least 1 node");
  if (o.standalone) {
    if (o.ips_given || !o.hostfile.empty() || !o.rank_table.empty()) {
      bad("--standalone runs one node on this machine; it cannot be combined with --ips, "
          "--hostfile or --rank_table");
    }
    if (o.nnodes > 1) bad("--standalone is one node, but --nnodes=" + std::to_string(o.nnodes));
    if (!o.master.empty() || !o.master_addr.empty() || o.master_port != 0) {
      bad("--standalone chooses the store's endpoint itself; leave out --master, --master_addr "
          "and --master_port");
    }
  }
}

// --nnodes=MIN:MAX and the rendezvous flags (torchrun's spellings; --elastic_timeout is
// Paddle's). An elastic node runs its own processes only: the others come and go.
void check_elastic(const Options& o) {
  if (!o.elastic()) {
    if (!o.rdzv_endpoint.empty() || !o.rdzv_id.empty()) {
      bad("--rdzv_endpoint/--rdzv_id are for elastic jobs: give --nnodes=MIN:MAX too");
    }
    return;
  }
  const std::string range =
      "--nnodes=" + std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes);
  if (o.rdzv_backend != "dpar" && o.rdzv_backend != "etcd")
    bad("--rdzv_backend=" + o.rdzv_backend + ": expected dpar or etcd");
  const bool etcd = o.rdzv_backend == "etcd";
  if (o.rdzv_endpoint.empty()) {
    bad(range + (etcd ? " with --rdzv_backend=etcd: give --rdzv_endpoint=ip:port[,ip:port...], "
                        "the etcd members' client addresses"
                      : " is an elastic job: give --rdzv_endpoint=host:port, the rendezvous "
                        "store's address (the node with that address hosts it)"));
  }
  // etcd: a list of the cluster's members; dpar: the one node that hosts the store.
  const std::vector<std::string> endpoints = split(o.rdzv_endpoint, ',');
  if (endpoints.size() > 1 && !etcd) {
    bad("--rdzv_endpoint=" + o.rdzv_endpoint +
        ": the dpar backend has one store (host:port); a list of members is for "
        "--rdzv_backend=etcd");
  }
  for (const std::string& one : endpoints) {
    std::string host;
    int port = 0;
    if (!split_endpoint(one, &host, &port)) {
      bad("--rdzv_endpoint=" + o.rdzv_endpoint + ": '" + one +
          "' is not host:port with a port in 1..65535");
    }
  }
  if (o.ps_mode() || o.ips_given || !o.hostfile.empty() || !o.rank_table.empty() || o.standalone ||
      !o.master.empty() || !o.master_addr.empty() || o.master_port != 0) {
    bad(range +
        " is an elastic job, whose nodes meet at --rdzv_endpoint: leave out --ips, "
        "--hostfile, --rank_table, --standalone, --master* and --run_mode=ps");
  }
  if (!(o.elastic_timeout > 0 && o.elastic_timeout <= 86400)) {
    bad("--elastic_timeout=" + std::to_string(o.elastic_timeout) + ": expected 0..86400 seconds");
  }
}

void check(const Options& o) {
  if (o.command.empty()) {
    bad("no program given (usage: dpar-launch [flags] <program> [args...]; see --help)");
  }
  if (o.run_mode != "collective" && o.run_mode != "ps") {
    bad("--run_mode=" + o.run_mode + ": expected collective or ps");
  }
  check_mode_flags(o);
  if (o.ps_mode()) check_ps(o);
  check_torchrun_flags(o);
  check_elastic(o);
  if (o.nproc_given && o.nproc_per_node < 1) {
    bad("--nproc_per_node=" + std::to_string(o.nproc_per_node) +
        ": expected at least 1 process per node");
  }
  if (o.nproc_per_node > 4096) {
    bad("--nproc_per_node=" + std::to_string(o.nproc_per_node) + ": expected at most 4096");
  }
  if (o.start_port < 1 || o.start_port > 65535) {
    bad("--start_port=" + std::to_string(o.start_port) + ": expected a port in 1..65535");
  }
  if (o.node_rank < -1) {
    bad("--node_rank=" + std::to_string(o.node_rank) + ": expected a node index >= 0");
  }
  if (o.max_restarts < 0) {
    bad("--max_restarts=" + std::to_string(o.max_restarts) + ": expected 0 or more");
  }
  if (!(o.grace_period >= 0 && o.grace_period <= 3600)) {
    bad("--grace_period=" + std::to_string(o.grace_period) + ": expected 0..3600 seconds");
  }
  if (!o.hostfile.empty() && !o.rank_table.empty()) {
    bad("--hostfile and --rank_table both describe the cluster; give one of them");
  }
  const std::string file_flag = !o.hostfile.empty() ? "--hostfile" : "--rank_table";
  if ((!o.hostfile.empty() || !o.rank_table.empty()) && o.ips_given) {
    bad("--ips and " + file_flag + " both describe the cluster; give one of them");
  }
  if (!o.rank_table.empty() && (o.gpus_given || o.nproc_given)) {
    bad(std::string(o.gpus_given ? "--gpus" : "--nproc_per_node") +
        " cannot be combined with --rank_table (the table lists each node's devices)");
  }
  if (o.gpus_given && o.gpus.empty()) bad("--gpus is empty (expected GPU ids like 0,1)");
  if (o.job_id.find_first_of(" \t\n/") != std::string::npos) {
    bad("--job_id='" + o.job_id + "': expected no spaces or slashes");
  }
}

}  // namespace

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  Flags flags("dpar-launch",
              "Starts the processes of a distributed job on this node; run it once per node:\n"
              "  dpar-launch [flags] <program> [args...]");
  auto& ips =
      flags.add_string("ips", o.ips, "comma-separated IPv4 addresses of the nodes, node 0 first");
  auto& host = flags.add_string("host", "",
                                "this node's address in the node list; empty: the "
                                "one that is an address of a local interface");
  auto& node_rank =
      flags.add_int("node_rank", -1, "this node's index in the node list (-1: detect)");
  auto& gpus = flags.add_string("gpus", "",
                                "GPU ids to use on each node, one process per GPU (or "
                                "--nproc_per_node, a multiple, sharing them); each "
                                "must be a device of the node (or an entry of an inherited "
                                "CUDA_VISIBLE_DEVICES) (alias --devices)");
  flags.add_alias("devices", "gpus");
  auto& nproc = flags.add_int("nproc_per_node", o.nproc_per_node,
                              "processes per node (CPU processes when there is no --gpus)");
  auto& hostfile = flags.add_string("hostfile", "", "Horovod/MPI hostfile ('host slots=N' lines)");
  auto& rank_table = flags.add_string("rank_table", "", "MindSpore-style rank table (JSON)");
  auto& log_dir = flags.add_string("log_dir", o.log_dir,
                                   "directory of the workerlog.N (ps mode: and serverlog.N) files "
                                   "(\"\": every process on the console)");
  auto& start_port =
      flags.add_int("start_port", o.start_port,
                    "first port of the per-rank endpoints (ps mode: of the --server_num servers)");
  auto& master = flags.add_string("master", "",
                                  "ip:port of the store rank 0 hosts; empty: rank 0's "
                                  "node, the port after the per-rank ports");
  auto& master_addr = flags.add_string(
      "master_addr", "", "torchrun's spelling: the store's address (the port: --master_port)");
  auto& master_port =
      flags.add_int("master_port", 0, "torchrun's spelling: the store's port (0: derived)");
  auto& nnodes = flags.add_string("nnodes", "",
                                  "torchrun's spelling: the number of nodes, which must match the "
                                  "node list (--ips etc.); MIN:MAX: an elastic job (see "
                                  "--rdzv_endpoint)");
  auto& rdzv_backend = flags.add_string("rdzv_backend", o.rdzv_backend,
                                        "elastic jobs: the rendezvous (dpar: a store on the "
                                        "--rdzv_endpoint node; etcd: an etcd cluster)");
  auto& rdzv_endpoint =
      flags.add_string("rdzv_endpoint", "",
                       "elastic jobs: host:port of the rendezvous store, the same on every node "
                       "(etcd: its members, ip:port,ip:port...)");
  auto& rdzv_id =
      flags.add_string("rdzv_id", "", "elastic jobs: the job id (default: from the endpoint)");
  auto& elastic_timeout = flags.add_double(
      "elastic_timeout", o.elastic_timeout,
      "elastic jobs: seconds to wait with fewer than MIN nodes before the job fails");
  auto& standalone = flags.add_bool(
      "standalone", false,
      "torchrun's spelling: one node on loopback; free ports are found unless --start_port");
  auto& job_id = flags.add_string(
      "job_id", "",
      "job id shared by all nodes; empty: from the master endpoint (ps mode: from server 0's)");
  auto& run_mode = flags.add_string("run_mode", o.run_mode,
                                    "collective, or ps (parameter servers and CPU trainers)");
  auto& servers = flags.add_string(
      "servers", "", "ps mode: ip:port of each parameter server; server id = position");
  auto& trainers = flags.add_string("trainers", "",
                                    "ps mode: ip of each trainer, one entry per trainer, trainer "
                                    "id = position (ip:port accepted, port unused; alias "
                                    "--workers)");
  flags.add_alias("workers", "trainers");
  auto& server_num = flags.add_int(
      "server_num", 0, "ps mode on one node (--ips): N servers at ports --start_port..");
  auto& trainer_num = flags.add_int("trainer_num", 0,
                                    "ps mode on one node (--ips): M trainers (alias --worker_num)");
  flags.add_alias("worker_num", "trainer_num");
  auto& job_token = flags.add_string("job_token", "",
                                     "ps mode: the job's secret, the same on every node; empty: "
                                     "DPAR_JOB_TOKEN, else random (one node) or derived from "
                                     "the job id (several nodes, with a warning)");
  auto& stop_timeout = flags.add_double(
      "server_stop_timeout", o.server_stop_timeout,
      "ps mode: seconds the servers get to exit by themselves after all trainers (all on this "
      "node) exited 0; then they are stopped and the launcher exits 1");
  auto& max_restarts = flags.add_int("max_restarts", o.max_restarts,
                                     "restart all local workers after a failure, up to N "
                                     "times (alias --max_restart)");
  flags.add_alias("max_restart", "max_restarts");  // paddle.distributed.launch's spelling
  auto& grace = flags.add_double("grace_period", o.grace_period,
                                 "seconds between SIGTERM and SIGKILL when stopping workers");
  auto& cpu_bind = flags.add_string(
      "cpu_bind", o.cpu_bind,
      "none, or cores: each local process on its own share of the CPUs the launcher may use "
      "(whole cores, in local-rank order; collective jobs)");

  o.command = flags.parse(args, /*allow_positional=*/true);
  o.ips = ips;
  o.host = host;
  o.node_rank = node_rank;
  o.gpus = gpus;
  o.nproc_per_node = nproc;
  o.hostfile = hostfile;
  o.rank_table = rank_table;
  o.log_dir = log_dir;
  o.start_port = start_port;
  o.master = master;
  o.job_id = job_id;
  o.master_addr = master_addr;
  o.master_port = master_port;
  o.standalone = standalone;
  o.rdzv_backend = rdzv_backend;
  o.rdzv_endpoint = rdzv_endpoint;
  o.rdzv_id = rdzv_id;
  o.elastic_timeout = elastic_timeout;
  if (flags.was_set("nnodes")) {
    int64_t min_nodes = 0;
    o.nnodes = parse_node_count(nnodes, &min_nodes);
    if (min_nodes == 0) min_nodes = o.nnodes;
    if (min_nodes < o.nnodes || !o.rdzv_endpoint.empty()) {
      o.min_nodes = min_nodes;
      o.max_nodes = o.nnodes;
      o.nnodes = 0;  // not a fixed node count
    }
  }
  o.run_mode = run_mode;
  o.max_restarts = max_restarts;
  o.grace_period = grace;
  o.cpu_bind = cpu_bind;
  if (o.cpu_bind != "none" && o.cpu_bind != "cores") {
    bad("--cpu_bind=" + o.cpu_bind + ": expected none or cores");
  }
  o.servers = servers;
  o.trainers = trainers;
  o.server_num = server_num;
  o.trainer_num = trainer_num;
  o.job_token = job_token;
  o.server_stop_timeout = stop_timeout;
  o.ips_given = flags.was_set("ips");
  o.gpus_given = flags.was_set("gpus");
  o.nproc_given = flags.was_set("nproc_per_node");
  o.servers_given = flags.was_set("servers");
  o.trainers_given = flags.was_set("trainers");
  o.server_num_given = flags.was_set("server_num");
  o.trainer_num_given = flags.was_set("trainer_num");
  o.job_token_given = flags.was_set("job_token");
  o.server_stop_timeout_given = flags.was_set("server_stop_timeout");
  o.start_port_given = flags.was_set("start_port");
  check(o);
  return o;
}

}  // namespace dpar::launch
