// dpar-launch: starts the processes of a distributed job on this node and supervises them.
// Run once per node:  dpar-launch --ips=10.0.0.1,10.0.0.2 --gpus=0,1 train --epochs=3
// Parameter-server mode:  dpar-launch --run_mode=ps --server_num=2 --trainer_num=2 train
// Every check of the input happens before anything starts: bad input is one line on stderr
// and exit status 2.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "address.h"
#include "cpu_binding.h"
#include "dpar/core/flags.h"
#include "elastic_host.h"
#include "environment.h"
#include "log_sink.h"
#include "options.h"
#include "plan.h"
#include "spawner.h"
#include "supervisor.h"
#include "text.h"

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

// "0..3" for consecutive ids, else "0,2,5".
std::string id_list(const std::vector<int>& ids) {
  bool consecutive = true;
  for (size_t i = 1; i < ids.size(); ++i) consecutive = consecutive && ids[i] == ids[i - 1] + 1;
  if (consecutive && ids.size() > 1) {
    return std::to_string(ids.front()) + ".." + std::to_string(ids.back());
  }
  std::vector<std::string> text;
  for (int id : ids) text.push_back(std::to_string(id));
  return join(text, ",");
}

// "dpar-launch: ps mode, node 0 of 1 (127.0.0.1): servers 0..1 at 127.0.0.1:6070,127.0.0.1:6071,
// trainers 0..1 of 2, ./train, logs in log/serverlog.0..1, log/workerlog.0..1"
std::string ps_summary(const LaunchPlan& plan) {
  const Node& node = plan.node();
  std::vector<int> servers, trainers;
  std::vector<std::string> endpoints;
  for (const Process& p : node.procs) {
    if (p.role == Role::kServer) {
      servers.push_back(p.role_id);
      endpoints.push_back(p.endpoint);
    } else {
      trainers.push_back(p.role_id);
    }
  }
  const std::string of_trainers = " of " + std::to_string(plan.trainers_num);
  std::string out = "dpar-launch: ps mode, node " + std::to_string(plan.node_rank) + " of " +
                    std::to_string(plan.cluster.nodes.size()) + " (" + node.ip + "): ";
  out += servers.empty() ? "no servers"
                         : "servers " + id_list(servers) + " at " + join(endpoints, ",");
  out += trainers.empty() ? ", no trainers (the job has " + std::to_string(plan.trainers_num) + ")"
                          : ", trainers " + id_list(trainers) + of_trainers;
  out += ", " + plan.program_path;
  if (plan.log_dir.empty()) return out + ", output on the console\n";
  std::vector<std::string> logs;
  const std::pair<size_t, const char*> files[] = {{servers.size(), "serverlog"},
                                                  {trainers.size(), "workerlog"}};
  for (const auto& [count, name] : files) {
    if (count == 0) continue;
    logs.push_back(plan.log_dir + "/" + name + ".0" +
                   (count > 1 ? ".." + std::to_string(count - 1) : std::string()));
  }
  return out + ", logs in " + join(logs, ", ") + "\n";
}

// "dpar-launch: elastic node, 1 process (2..3 nodes of 1), rendezvous 10.0.0.1:29400 (hosted
// here), job 'j', ./train, logs in log/workerlog.0"
std::string elastic_summary(const LaunchPlan& plan, bool hosting) {
  const size_t procs = plan.node().procs.size();
  std::string summary = "dpar-launch: elastic node, " + std::to_string(procs) + " process" +
                        (procs == 1 ? "" : "es") +
                        " (the job: " + std::to_string(plan.min_members / static_cast<int>(procs)) +
                        ".." + std::to_string(plan.max_members / static_cast<int>(procs)) +
                        " nodes), rendezvous " + (plan.rdzv_backend == "etcd" ? "etcd at " : "") +
                        plan.rdzv_endpoint + (hosting ? " (hosted here)" : "") + ", job '" +
                        plan.job_id + "', " + plan.program_path;
  return summary + (plan.log_dir.empty() ? ", output on the console\n"
                                         : ", logs in " + plan.log_dir + "/workerlog.0.." +
                                               std::to_string(procs - 1) + "\n");
}

std::string collective_summary(const LaunchPlan& plan) {
  const Node& node = plan.node();
  const int first = node.procs.front().rank;
  std::string summary = "dpar-launch: node " + std::to_string(plan.node_rank) + " of " +
                        std::to_string(plan.cluster.nodes.size()) + " (" + node.ip + "), ranks " +
                        std::to_string(first) + ".." + std::to_string(node.procs.back().rank) +
                        " of " + std::to_string(plan.cluster.world_size()) + ", " +
                        plan.program_path;
  const std::vector<std::string> gpus = node.gpus();
  if (!gpus.empty() && gpus.size() < node.procs.size()) {
    summary += ", " + std::to_string(node.procs.size()) + " ranks sharing GPU" +
               (gpus.size() == 1 ? " " : "s ") + join(gpus, ",") +
               " (NCCL_HOSTID per rank: NCCL over sockets)";
  }
  summary += plan.log_dir.empty() ? ", output on the console\n"
                                  : ", logs in " + plan.log_dir + "/workerlog.0.." +
                                        std::to_string(node.procs.size() - 1) + "\n";
  return summary;
}

int launch(int argc, char** argv) {
  const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  const std::vector<std::string> local_addresses = local_ipv4_addresses();
  LaunchPlan plan = make_plan(options, local_addresses);
  const Env base = current_environment();
  auto path = base.find("PATH");
  plan.program_path = resolve_program(plan.command[0], path == base.end() ? "" : path->second);
  check_local_gpus(plan, base, this_machine_gpus);

  bool token_derived = false;
  if (plan.ps_mode) {
    std::string given = options.job_token;
    if (auto inherited = base.find("DPAR_JOB_TOKEN"); given.empty() && inherited != base.end()) {
      given = inherited->second;
    }
    plan.job_token =
        choose_job_token(given, plan.cluster.nodes.size() == 1, plan.job_id, &token_derived);
  }

  const int cpus = usable_cpus();
  const auto& procs = plan.node().procs;
  std::vector<std::vector<int>> cpu_shares_by_process(procs.size());
  if (plan.bind_cpus) {
    const std::vector<int> allowed = allowed_cpus();
    cpu_shares_by_process = cpu_shares(allowed, core_ids(allowed), static_cast<int>(procs.size()));
  }
  std::vector<Env> envs;
  for (size_t i = 0; i < procs.size(); ++i) {
    envs.push_back(worker_environment(plan, procs[i], base, /*restart_count=*/0, cpus,
                                      cpu_shares_by_process[i]));
  }
  check_ports_free(plan);
  make_log_dir(plan.log_dir);
  if (!plan.log_dir.empty()) {
    std::vector<std::string> names;
    for (const Process& p : plan.node().procs) names.push_back(log_file_name(p));
    const std::string kept = move_earlier_logs(plan.log_dir, names);
    if (!kept.empty()) {
      write_all(STDOUT_FILENO, "dpar-launch: " + plan.log_dir +
                                   " held an earlier run's logs; moved them to " + kept + "\n");
    }
  }

  if (token_derived) {
    write_all(STDERR_FILENO,
              "dpar-launch: no --job_token given for a multi-node ps job: using one derived "
              "from the job id (keeps jobs apart, is not a secret; pass the same --job_token "
              "to every node's launcher to protect the servers)\n");
  }
  // The table shows the environment of the process whose output the console echoes.
  const size_t echo = static_cast<size_t>(plan.echo_local_rank());
  std::string title =
      plan.ps_mode ? "Parameter-server environment of " : "Distributed environment of local rank 0";
  if (plan.ps_mode) title.append(process_name(plan.node().procs[echo]));
  // An elastic job's store outlives this node's workers (the job survives their loss).
  std::unique_ptr<ElasticStoreHost> store_host;
  if (plan.elastic) store_host = ElasticStoreHost::start_if_here(plan, local_addresses);
  write_all(STDOUT_FILENO, format_env_table(envs[echo], title) +
                               (plan.ps_mode   ? ps_summary(plan)
                                : plan.elastic ? elastic_summary(plan, store_host != nullptr)
                                               : collective_summary(plan)));

  Supervisor supervisor(plan, std::move(envs), std::move(cpu_shares_by_process));
  const int status = supervisor.run();
  if (store_host) {
    const auto idle =
        std::chrono::milliseconds(static_cast<int64_t>(plan.elastic_timeout * 1000.0) + 10000);
    store_host->wait_for_job_end(idle);
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  return dpar::run_main("dpar-launch", [&] { return launch(argc, argv); });
}
