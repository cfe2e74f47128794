#include "environment.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "cpu_binding.h"
#include "dpar/core/device.h"
#include "dpar/core/flags.h"
#include "text.h"

extern char** environ;

namespace dpar::launch {

Env current_environment() {
  Env env;
  for (char** it = environ; it && *it; ++it) {
    const char* eq = std::strchr(*it, '=');
    if (eq) env.emplace(std::string(*it, static_cast<size_t>(eq - *it)), std::string(eq + 1));
  }
  return env;
}

int usable_cpus() {
  if (const size_t allowed = allowed_cpus().size(); allowed > 0) return static_cast<int>(allowed);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

namespace {

bool inherits_visible_devices(const Env& base) {
  auto it = base.find("CUDA_VISIBLE_DEVICES");
  return it != base.end() && !trim(it->second).empty();
}

// "1 CUDA device: 0", "2 CUDA devices: 0,1", "8 CUDA devices: 0..7".
std::string device_range(int count) {
  const std::string ids = count == 1 ? "0" : count == 2 ? "0,1" : "0.." + std::to_string(count - 1);
  return std::to_string(count) + (count == 1 ? " CUDA device: " : " CUDA devices: ") + ids;
}

}  // namespace

GpuInventory this_machine_gpus() {
  GpuInventory out;
  out.count = cuda_device_count();
  if (out.count == 0) out.unavailable_reason = cuda_unavailable_reason();
  return out;
}

void check_local_gpus(const LaunchPlan& plan, const Env& base,
                      const std::function<GpuInventory()>& inventory) {
  if (plan.ps_mode || inherits_visible_devices(base)) return;
  std::optional<GpuInventory> found;
  for (const Process& p : plan.node().procs) {
    if (p.gpu.empty()) continue;
    if (!found) found = inventory();
    // Ids are non-negative integers of at most 6 digits (parse_gpu_list, the rank table).
    if (std::stoll(p.gpu) < found->count) continue;
    const std::string why =
        found->count == 0 ? found->unavailable_reason : "it has " + device_range(found->count);
    throw FlagError("dpar-launch: " + plan.gpu_source + ": GPU " + p.gpu +
                    " is not a device of this machine (" + why + ")");
  }
}

namespace {

// The node's GPU list for CUDA_VISIBLE_DEVICES; empty when its processes run on CPUs.
std::string visible_devices(const std::vector<std::string>& gpus, const Env& base) {
  if (gpus.empty()) return "";
  auto inherited = base.find("CUDA_VISIBLE_DEVICES");
  if (inherited != base.end() && !trim(inherited->second).empty()) {
    const std::vector<std::string> allowed = split(inherited->second, ',');
    for (const std::string& gpu : gpus) {
      if (std::find(allowed.begin(), allowed.end(), gpu) == allowed.end()) {
        throw FlagError("dpar-launch: GPU " + gpu +
                        " is not in this launcher's "
                        "CUDA_VISIBLE_DEVICES=" +
                        inherited->second + " (--gpus names GPUs from that list)");
      }
    }
  }
  return join(gpus, ",");
}

}  // namespace

namespace {

// ps mode: the variables of a parameter server or trainer. The collective names (ranks, world
// size, master) are not set: a ps job has none of them.
Env ps_environment(const LaunchPlan& plan, const Process& proc, const Env& base, int restart_count,
                   int cpus) {
  Env env = base;
  const Node& node = plan.node();
  const std::string servers = join(plan.servers, ",");
  const std::string server_num = std::to_string(plan.servers.size());
  const std::string trainers_num = std::to_string(plan.trainers_num);
  const std::string id = std::to_string(proc.role_id);
  const bool server = proc.role == Role::kServer;

  env["TRAINING_ROLE"] = server ? "PSERVER" : "TRAINER";
  env["DPAR_RUN_MODE"] = "ps";
  env["DPAR_PSERVER_ENDPOINTS"] = servers;
  env["DPAR_SERVER_NUM"] = server_num;
  env["DPAR_TRAINERS_NUM"] = trainers_num;
  env["DPAR_JOB_ID"] = plan.job_id;
  env["DPAR_JOB_TOKEN"] = plan.job_token;
  env["DPAR_NODE_RANK"] = std::to_string(plan.node_rank);
  env["DPAR_NNODES"] = std::to_string(plan.cluster.nodes.size());
  env["DPAR_RESTART_COUNT"] = std::to_string(restart_count);
  env["DPAR_DEVICE"] = "cpu";
  env["PADDLE_PSERVERS_IP_PORT_LIST"] = servers;
  env["PADDLE_TRAINERS_NUM"] = trainers_num;
  env["POD_IP"] = node.ip;
  if (server) {
    env["DPAR_SERVER_ID"] = id;
    env["DPAR_CURRENT_ENDPOINT"] = proc.endpoint;
    env["PADDLE_CURRENT_ENDPOINT"] = proc.endpoint;
    env["PADDLE_PORT"] = proc.endpoint.substr(proc.endpoint.rfind(':') + 1);
    // A server answers requests; the trainers get the node's cores.
    if (!env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  } else {
    env["DPAR_TRAINER_ID"] = id;
    env["PADDLE_TRAINER_ID"] = id;
    if (!env.count("OMP_NUM_THREADS")) {
      env["OMP_NUM_THREADS"] =
          std::to_string(std::max(1, cpus / std::max(1, plan.local_count(Role::kTrainer))));
    }
  }
  return env;
}

}  // namespace

Env worker_environment(const LaunchPlan& plan, const Process& proc, const Env& base,
                       int restart_count, int cpus, const std::vector<int>& cpu_share) {
  if (plan.ps_mode) {
    Env env = ps_environment(plan, proc, base, restart_count, cpus);
    env.erase("DPAR_CPUS");  // ps jobs run unbound
    return env;
  }
  Env env = base;
  const Node& node = plan.node();
  const std::string rank = std::to_string(proc.rank);
  const std::string world = std::to_string(plan.cluster.world_size());
  const std::string local_rank = std::to_string(proc.local_rank);
  const std::string local_size = std::to_string(node.procs.size());
  const std::string endpoints = join(plan.endpoints, ",");
  const std::string& current = plan.endpoints[static_cast<size_t>(proc.rank)];
  const std::vector<std::string> gpus = node.gpus();
  const std::string devices = visible_devices(gpus, base);

  // The process's GPU as numbered inside CUDA_VISIBLE_DEVICES.
  const std::string device_index =
      std::to_string(std::find(gpus.begin(), gpus.end(), proc.gpu) - gpus.begin());
  env["DPAR_LOCAL_RANK"] = local_rank;
  env["DPAR_LOCAL_SIZE"] = local_size;
  env["DPAR_DEVICE"] = proc.gpu.empty() ? "cpu" : "gpu:" + device_index;
  env["DPAR_RESTART_COUNT"] = std::to_string(restart_count);
  env["LOCAL_RANK"] = local_rank;
  env["LOCAL_WORLD_SIZE"] = local_size;
  if (plan.elastic) {
    // No rank or world size: the members take them from each rendezvous round (elastic.h).
    env["DPAR_RDZV_BACKEND"] = plan.rdzv_backend;
    env["DPAR_RDZV_ENDPOINT"] = plan.rdzv_endpoint;
    env["DPAR_RDZV_ID"] = plan.job_id;
    env["DPAR_ELASTIC_MIN"] = std::to_string(plan.min_members);
    env["DPAR_ELASTIC_MAX"] = std::to_string(plan.max_members);
    std::ostringstream timeout;
    timeout << plan.elastic_timeout;
    env["DPAR_ELASTIC_TIMEOUT"] = timeout.str();
  } else {
    env["DPAR_RANK"] = rank;
    env["DPAR_WORLD_SIZE"] = world;
    env["DPAR_NODE_RANK"] = std::to_string(plan.node_rank);
    env["DPAR_NNODES"] = std::to_string(plan.cluster.nodes.size());
    env["DPAR_MASTER"] = plan.master();
    env["DPAR_ENDPOINTS"] = endpoints;
    env["DPAR_CURRENT_ENDPOINT"] = current;
    env["DPAR_JOB_ID"] = plan.job_id;

    env["PADDLE_TRAINER_ID"] = rank;
    env["PADDLE_TRAINERS_NUM"] = world;
    env["PADDLE_TRAINER_ENDPOINTS"] = endpoints;
    env["PADDLE_CURRENT_ENDPOINT"] = current;
    env["PADDLE_RANK_IN_NODE"] = local_rank;

    env["RANK"] = rank;
    env["WORLD_SIZE"] = world;
    env["MASTER_ADDR"] = plan.master_ip;
    env["MASTER_PORT"] = std::to_string(plan.master_port);
  }

  if (!proc.gpu.empty()) {
    env["CUDA_VISIBLE_DEVICES"] = devices;
    env["FLAGS_selected_gpus"] = device_index;
    // Ranks sharing a GPU: NCCL refuses two ranks on one device of one host, so each gets its
    // own NCCL_HOSTID (NCCL then connects them like ranks of different hosts, over sockets:
    // slower than one rank per GPU, meant for testing). Loopback carries it on a one-node job.
    if (node.procs.size() > gpus.size()) {
      if (!base.count("NCCL_HOSTID")) {
        env["NCCL_HOSTID"] = "dpar-" + node.ip + "-rank" + local_rank;
      }
      if (plan.cluster.nodes.size() == 1 && !base.count("NCCL_SOCKET_IFNAME")) {
        env["NCCL_SOCKET_IFNAME"] = "lo";
      }
    }
  }
  // A bound process (--cpu_bind=cores) is told its CPUs; an inherited list is not this one's.
  env.erase("DPAR_CPUS");
  if (!cpu_share.empty()) env["DPAR_CPUS"] = cpu_list_text(cpu_share);
  // Without a limit every process would start one OpenMP thread per core and the node
  // would run local_size times more threads than cores; a bound one, one per CPU it has.
  if (!env.count("OMP_NUM_THREADS")) {
    env["OMP_NUM_THREADS"] =
        cpu_share.empty() ? std::to_string(std::max(1, cpus / static_cast<int>(node.procs.size())))
                          : std::to_string(cpu_share.size());
  }
  return env;
}

std::vector<std::pair<std::string, std::string>> launcher_variables(const Env& env) {
  static const char* const kNames[] = {"TRAINING_ROLE",
                                       "DPAR_RUN_MODE",
                                       "DPAR_RANK",
                                       "DPAR_WORLD_SIZE",
                                       "DPAR_LOCAL_RANK",
                                       "DPAR_LOCAL_SIZE",
                                       "DPAR_NODE_RANK",
                                       "DPAR_NNODES",
                                       "DPAR_MASTER",
                                       "DPAR_ENDPOINTS",
                                       "DPAR_CURRENT_ENDPOINT",
                                       "DPAR_RDZV_ENDPOINT",
                                       "DPAR_RDZV_ID",
                                       "DPAR_ELASTIC_MIN",
                                       "DPAR_ELASTIC_MAX",
                                       "DPAR_ELASTIC_TIMEOUT",
                                       "DPAR_PSERVER_ENDPOINTS",
                                       "DPAR_SERVER_ID",
                                       "DPAR_SERVER_NUM",
                                       "DPAR_TRAINER_ID",
                                       "DPAR_TRAINERS_NUM",
                                       "DPAR_JOB_ID",
                                       "DPAR_JOB_TOKEN",
                                       "DPAR_DEVICE",
                                       "DPAR_RESTART_COUNT",
                                       "PADDLE_TRAINER_ID",
                                       "PADDLE_TRAINERS_NUM",
                                       "PADDLE_TRAINER_ENDPOINTS",
                                       "PADDLE_PSERVERS_IP_PORT_LIST",
                                       "PADDLE_CURRENT_ENDPOINT",
                                       "PADDLE_PORT",
                                       "PADDLE_RANK_IN_NODE",
                                       "POD_IP",
                                       "FLAGS_selected_gpus",
                                       "NCCL_HOSTID",
                                       "RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "CUDA_VISIBLE_DEVICES",
                                       "DPAR_CPUS",
                                       "OMP_NUM_THREADS"};
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : kNames) {
    auto it = env.find(name);
    if (it == env.end()) continue;
    // The token protects the servers: it never appears on the console or in a log.
    out.emplace_back(name, std::string(name) == "DPAR_JOB_TOKEN" ? "(set)" : it->second);
  }
  return out;
}

std::string format_env_table(const Env& env, const std::string& title) {
  constexpr size_t kMaxValue = 72;  // long endpoint lists are shortened, not wrapped
  auto rows = launcher_variables(env);
  for (auto& [name, value] : rows) {
    if (value.size() > kMaxValue) {
      const size_t count = static_cast<size_t>(std::count(value.begin(), value.end(), ',')) + 1;
      value = value.substr(0, kMaxValue - 24) + "... (" + std::to_string(count) + " entries)";
    }
  }
  size_t name_w = 4, value_w = 5;
  for (const auto& [name, value] : rows) {
    name_w = std::max(name_w, name.size());
    value_w = std::max(value_w, value.size());
  }
  const size_t inner = std::max(name_w + value_w + 5, title.size() + 4);
  value_w = inner - name_w - 5;
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size(), ' '); };
  // Appending (rather than "+" + std::string(...)) sidesteps a GCC 12 -Wrestrict false alarm.
  auto rule_of = [inner](char c) {
    std::string line(1, '+');
    line.append(inner, c).append("+\n");
    return line;
  };
  const std::string rule_eq = rule_of('=');
  const std::string rule = rule_of('-');
  const size_t left = (inner - title.size()) / 2;
  std::string out = rule_eq;
  out.append("|").append(left, ' ').append(title).append(inner - left - title.size(), ' ');
  out.append("|\n").append(rule);
  for (const auto& [name, value] : rows) {
    out += "| " + pad(name, name_w) + " | " + pad(value, value_w) + " |\n";
  }
  return out + rule_eq;
}

}  // namespace dpar::launch
