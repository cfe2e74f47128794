#include "options.h"

#include "dpar/core/flags.h"

namespace dpar::launch {
namespace {

[[noreturn]] void bad(const std::string& message) { throw FlagError("dpar-launch: " + message); }

void check(const Options& o) {
  if (o.command.empty()) {
    bad("no program given (usage: dpar-launch [flags] <program> [args...]; see --help)");
  }
  if (o.run_mode == "ps") {
    bad("--run_mode=ps: this build's dpar-launch supports collective mode only "
        "(--run_mode=collective)");
  }
  if (o.run_mode != "collective") bad("--run_mode=" + o.run_mode + ": expected collective");
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
                                "GPU ids to use on each node, one process per GPU "
                                "(alias --devices)");
  flags.add_alias("devices", "gpus");
  auto& nproc = flags.add_int("nproc_per_node", o.nproc_per_node,
                              "processes per node (CPU processes when there is no --gpus)");
  auto& hostfile = flags.add_string("hostfile", "", "Horovod/MPI hostfile ('host slots=N' lines)");
  auto& rank_table = flags.add_string("rank_table", "", "MindSpore-style rank table (JSON)");
  auto& log_dir = flags.add_string(
      "log_dir", o.log_dir, "directory of workerlog.N files (\"\": every process on the console)");
  auto& start_port =
      flags.add_int("start_port", o.start_port, "first port of the per-rank endpoints");
  auto& master = flags.add_string("master", "",
                                  "ip:port of the store rank 0 hosts; empty: rank 0's "
                                  "node, the port after the per-rank ports");
  auto& job_id =
      flags.add_string("job_id", "", "job id shared by all nodes; empty: from the master endpoint");
  auto& run_mode =
      flags.add_string("run_mode", o.run_mode, "collective (the only mode of this build)");
  auto& max_restarts = flags.add_int("max_restarts", o.max_restarts,
                                     "restart all local workers after a failure, up to N "
                                     "times (alias --max_restart)");
  flags.add_alias("max_restart", "max_restarts");  // paddle.distributed.launch's spelling
  auto& grace = flags.add_double("grace_period", o.grace_period,
                                 "seconds between SIGTERM and SIGKILL when stopping workers");

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
  o.run_mode = run_mode;
  o.max_restarts = max_restarts;
  o.grace_period = grace;
  o.ips_given = flags.was_set("ips");
  o.gpus_given = flags.was_set("gpus");
  o.nproc_given = flags.was_set("nproc_per_node");
  check(o);
  return o;
}

}  // namespace dpar::launch
