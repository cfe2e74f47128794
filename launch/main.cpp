// dpar-launch: starts the processes of a distributed job on this node and supervises them.
// Run once per node:  dpar-launch --ips=10.0.0.1,10.0.0.2 --gpus=0,1 train --epochs=3
// Every check of the input happens before anything starts: bad input is one line on stderr
// and exit status 2.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "address.h"
#include "dpar/core/flags.h"
#include "environment.h"
#include "log_sink.h"
#include "options.h"
#include "plan.h"
#include "spawner.h"
#include "supervisor.h"

namespace {

using namespace dpar::launch;

void make_log_dir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw dpar::FlagError("dpar-launch: --log_dir=" + dir + ": cannot create the directory (" +
                          (ec ? ec.message() : "a file is in the way") + ")");
  }
}

int launch(int argc, char** argv) {
  const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  LaunchPlan plan = make_plan(options, local_ipv4_addresses());
  const Env base = current_environment();
  auto path = base.find("PATH");
  plan.program_path = resolve_program(plan.command[0], path == base.end() ? "" : path->second);

  const int cpus = usable_cpus();
  std::vector<Env> envs;
  for (const Process& p : plan.node().procs) {
    envs.push_back(worker_environment(plan, p, base, /*restart_count=*/0, cpus));
  }
  check_ports_free(plan);
  make_log_dir(plan.log_dir);

  const Node& node = plan.node();
  const int first = node.procs.front().rank;
  std::string summary = "dpar-launch: node " + std::to_string(plan.node_rank) + " of " +
                        std::to_string(plan.cluster.nodes.size()) + " (" + node.ip + "), ranks " +
                        std::to_string(first) + ".." + std::to_string(node.procs.back().rank) +
                        " of " + std::to_string(plan.cluster.world_size()) + ", " +
                        plan.program_path;
  summary += plan.log_dir.empty() ? ", output on the console\n"
                                  : ", logs in " + plan.log_dir + "/workerlog.0.." +
                                        std::to_string(node.procs.size() - 1) + "\n";
  write_all(STDOUT_FILENO,
            format_env_table(envs.front(), "Distributed environment of local rank 0") + summary);

  Supervisor supervisor(plan, std::move(envs));
  return supervisor.run();
}

}  // namespace

int main(int argc, char** argv) {
  return dpar::run_main("dpar-launch", [&] { return launch(argc, argv); });
}
