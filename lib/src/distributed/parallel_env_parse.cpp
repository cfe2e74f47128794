// parse_parallel_env(): turns the variables of one of five launchers into a ParallelEnv.
//
// Where each launcher puts the store (rank 0 hosts the gRPC StoreServer there):
//   dpar-launch  DPAR_MASTER=ip:port, chosen by the launcher.
//   torchrun     MASTER_ADDR:MASTER_PORT. With torchrun's default static rendezvous the agent
//                process already listens on MASTER_PORT (it says so with
//                TORCHELASTIC_USE_AGENT_STORE=True), so then the store takes MASTER_PORT + 1.
//   paddle       the first entry of PADDLE_TRAINER_ENDPOINTS, i.e. trainer 0's own endpoint:
//                the launcher reserved that port for trainer 0 (Paddle's trainer 0 serves its
//                NCCL-id exchange there), so it is free for trainer 0 and known to everyone.
//   slurm        MASTER_ADDR/MASTER_PORT when set; otherwise the first host of
//                SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) and port 15000 + SLURM_JOB_ID %
//                15000 (below Linux's ephemeral range, different for concurrent jobs).
//   openmpi      MASTER_ADDR/MASTER_PORT, required for more than one rank (mpirun exports
//                nothing usable as a rendezvous point).
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <tuple>

#include "dpar/distributed/parallel_env.h"

extern char** environ;

namespace dpar::dist {
namespace {

using Env = std::map<std::string, std::string>;

// Variable names of one launcher flavour, for error messages.
struct Names {
  const char* source;
  std::string rank, world, local_rank, local_size, node_rank, nnodes, endpoints, current, master;
};

[[noreturn]] void fail(const Names& n, const std::string& what) {
  DPAR_FAIL("parse_parallel_env (", n.source, " environment): ", what);
}

// Empty values count as absent: shells and job schedulers often export empty variables.
const std::string* lookup(const Env& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) return nullptr;
  return &it->second;
}

bool has(const Env& env, const std::string& key) { return lookup(env, key) != nullptr; }

std::optional<long long> parse_integer(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

std::optional<int> int_var(const Env& env, const Names& n, const std::string& key) {
  const std::string* value = lookup(env, key);
  if (!value) return std::nullopt;
  const auto v = parse_integer(*value);
  if (!v || *v < INT32_MIN || *v > INT32_MAX) {
    fail(n, key + "='" + *value + "' is not an integer");
  }
  return static_cast<int>(*v);
}

int required_int(const Env& env, const Names& n, const std::string& key, const std::string& why) {
  const auto v = int_var(env, n, key);
  if (!v) fail(n, key + " is not set (" + why + ")");
  return *v;
}

// port_text is the port part of `value`, the whole variable's value (for messages).
int parse_port(const Names& n, const std::string& var, const std::string& value,
               const std::string& port_text) {
  const auto v = parse_integer(port_text);
  if (!v) fail(n, var + "='" + value + "': port '" + port_text + "' is not an integer");
  if (*v < 1 || *v > 65535) fail(n, var + "='" + value + "': port must be in 1..65535");
  return static_cast<int>(*v);
}

// "host:port" or "[v6addr]:port" -> (host, port).
std::pair<std::string, int> parse_endpoint(const Names& n, const std::string& var,
                                           const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    fail(n, var + "='" + text + "' is not of the form host:port");
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return {host, parse_port(n, var, text, text.substr(colon + 1))};
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(sep, start), text.size());
    std::string item = text.substr(start, end - start);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::string host_of(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  return colon == std::string::npos ? endpoint : endpoint.substr(0, colon);
}

// The consistency rules shared by every launcher.
void validate(ParallelEnv& e, const Names& n) {
  auto var = [](const std::string& name, long long v) { return name + "=" + std::to_string(v); };
  if (e.world_size < 1) fail(n, var(n.world, e.world_size) + " must be at least 1");
  if (e.rank < 0) fail(n, var(n.rank, e.rank) + " must not be negative");
  if (e.rank >= e.world_size) {
    fail(n, var(n.rank, e.rank) + " must be less than " + var(n.world, e.world_size));
  }
  if (e.local_size < 1) fail(n, var(n.local_size, e.local_size) + " must be at least 1");
  if (e.local_size > e.world_size) {
    fail(n, var(n.local_size, e.local_size) + " exceeds " + var(n.world, e.world_size));
  }
  if (e.local_rank < 0) fail(n, var(n.local_rank, e.local_rank) + " must not be negative");
  if (e.local_rank >= e.local_size) {
    fail(n,
         var(n.local_rank, e.local_rank) + " must be less than " + var(n.local_size, e.local_size));
  }
  if (e.nnodes < 1) fail(n, var(n.nnodes, e.nnodes) + " must be at least 1");
  if (e.node_rank < 0 || e.node_rank >= e.nnodes) {
    fail(n, var(n.node_rank, e.node_rank) + " must be in 0.." + std::to_string(e.nnodes - 1) +
                " (" + var(n.nnodes, e.nnodes) + ")");
  }
  if (!e.endpoints.empty()) {
    if (static_cast<int>(e.endpoints.size()) != e.world_size) {
      fail(n, n.endpoints + " lists " + std::to_string(e.endpoints.size()) + " endpoints (" +
                  join(e.endpoints) + ") but " + var(n.world, e.world_size));
    }
    for (const auto& ep : e.endpoints) parse_endpoint(n, n.endpoints, ep);
    if (!e.current_endpoint.empty() && e.current_endpoint != e.endpoints[e.rank]) {
      fail(n, n.current + "=" + e.current_endpoint + " but entry " + std::to_string(e.rank) + " (" +
                  n.rank + ") of " + n.endpoints + " is " + e.endpoints[e.rank]);
    }
  }
  if (e.world_size > 1 && (e.master_addr.empty() || e.master_port <= 0)) {
    fail(n, var(n.world, e.world_size) + " needs a master address for the store: set " + n.master);
  }
}

ParallelEnv parse_dpar(const Env& env) {
  Names n{"dpar-launch",           "DPAR_RANK",          "DPAR_WORLD_SIZE", "DPAR_LOCAL_RANK",
          "DPAR_LOCAL_SIZE",       "DPAR_NODE_RANK",     "DPAR_NNODES",     "DPAR_ENDPOINTS",
          "DPAR_CURRENT_ENDPOINT", "DPAR_MASTER=ip:port"};
  ParallelEnv e;
  e.source = "dpar-launch";
  e.rank = required_int(env, n, "DPAR_RANK", "dpar-launch sets DPAR_RANK and DPAR_WORLD_SIZE");
  e.world_size =
      required_int(env, n, "DPAR_WORLD_SIZE", "dpar-launch sets DPAR_RANK and DPAR_WORLD_SIZE");
  e.local_size = int_var(env, n, "DPAR_LOCAL_SIZE").value_or(e.world_size);
  e.local_rank = int_var(env, n, "DPAR_LOCAL_RANK").value_or(e.rank);
  e.nnodes = int_var(env, n, "DPAR_NNODES").value_or(1);
  e.node_rank = int_var(env, n, "DPAR_NODE_RANK").value_or(0);
  if (const auto* master = lookup(env, "DPAR_MASTER")) {
    std::tie(e.master_addr, e.master_port) = parse_endpoint(n, "DPAR_MASTER", *master);
  } else {
    e.master_addr.clear();
  }
  if (const auto* eps = lookup(env, "DPAR_ENDPOINTS")) e.endpoints = split(*eps, ',');
  if (const auto* cur = lookup(env, "DPAR_CURRENT_ENDPOINT")) e.current_endpoint = *cur;
  if (const auto* job = lookup(env, "DPAR_JOB_ID")) e.job_id = *job;
  if (const auto* dev = lookup(env, "DPAR_DEVICE")) {
    try {
      Device::parse(*dev);
    } catch (const Error&) {
      fail(n, "DPAR_DEVICE='" + *dev + "' is not a device (cpu, gpu:<n>)");
    }
    e.device = *dev;
  }
  validate(e, n);
  return e;
}

// MASTER_ADDR/MASTER_PORT when both are set (torchrun, and optional for Slurm / Open MPI).
bool master_from_env(const Env& env, const Names& n, ParallelEnv& e) {
  const auto* addr = lookup(env, "MASTER_ADDR");
  const auto* port = lookup(env, "MASTER_PORT");
  if (addr && !port) fail(n, "MASTER_ADDR=" + *addr + " is set but MASTER_PORT is not");
  if (port && !addr) fail(n, "MASTER_PORT=" + *port + " is set but MASTER_ADDR is not");
  if (!addr) return false;
  e.master_addr = *addr;
  e.master_port = parse_port(n, "MASTER_PORT", *port, *port);
  return true;
}

ParallelEnv parse_torchrun(const Env& env) {
  Names n{"torchrun",
          "RANK",
          "WORLD_SIZE",
          "LOCAL_RANK",
          "LOCAL_WORLD_SIZE",
          "GROUP_RANK",
          "GROUP_WORLD_SIZE",
          "",
          "",
          "MASTER_ADDR and MASTER_PORT"};
  ParallelEnv e;
  e.source = "torchrun";
  e.rank = required_int(env, n, "RANK", "torchrun sets RANK and WORLD_SIZE");
  e.world_size = required_int(env, n, "WORLD_SIZE", "torchrun sets RANK and WORLD_SIZE");
  e.local_size = int_var(env, n, "LOCAL_WORLD_SIZE").value_or(e.world_size);
  e.local_rank = int_var(env, n, "LOCAL_RANK").value_or(e.rank % std::max(1, e.local_size));
  const int per_node = std::max(1, e.local_size);
  e.nnodes = int_var(env, n, "GROUP_WORLD_SIZE").value_or((e.world_size + per_node - 1) / per_node);
  e.node_rank = int_var(env, n, "GROUP_RANK").value_or(e.rank / per_node);
  e.master_addr.clear();
  if (master_from_env(env, n, e)) {
    const auto* agent_store = lookup(env, "TORCHELASTIC_USE_AGENT_STORE");
    if (agent_store && *agent_store == "True") {
      // The elastic agent hosts its own TCPStore on MASTER_PORT.
      if (e.master_port == 65535) fail(n, "MASTER_PORT=65535 leaves no port for the store");
      ++e.master_port;
    }
  }
  if (const auto* run_id = lookup(env, "TORCHELASTIC_RUN_ID")) e.job_id = *run_id;
  validate(e, n);
  return e;
}

ParallelEnv parse_paddle(const Env& env) {
  Names n{"paddle",
          "PADDLE_TRAINER_ID",
          "PADDLE_TRAINERS_NUM",
          "PADDLE_RANK_IN_NODE",
          "local size",
          "node rank",
          "node count",
          "PADDLE_TRAINER_ENDPOINTS",
          "PADDLE_CURRENT_ENDPOINT",
          "PADDLE_TRAINER_ENDPOINTS"};
  ParallelEnv e;
  e.source = "paddle";
  const char* why = "paddle.distributed.launch sets PADDLE_TRAINER_ID and PADDLE_TRAINERS_NUM";
  e.rank = required_int(env, n, "PADDLE_TRAINER_ID", why);
  e.world_size = required_int(env, n, "PADDLE_TRAINERS_NUM", why);
  if (const auto* eps = lookup(env, "PADDLE_TRAINER_ENDPOINTS")) e.endpoints = split(*eps, ',');
  if (const auto* cur = lookup(env, "PADDLE_CURRENT_ENDPOINT")) e.current_endpoint = *cur;
  e.master_addr.clear();
  if (!e.endpoints.empty()) {
    std::tie(e.master_addr, e.master_port) =
        parse_endpoint(n, "PADDLE_TRAINER_ENDPOINTS", e.endpoints[0]);
  }
  // Node layout from the endpoint list: one node per distinct host, in order of appearance.
  const std::string my_host =
      !e.current_endpoint.empty()
          ? host_of(e.current_endpoint)
          : (e.rank < static_cast<int>(e.endpoints.size()) ? host_of(e.endpoints[e.rank]) : "");
  std::vector<std::string> hosts;
  int on_my_host = 0, before_me_on_my_host = 0;
  for (size_t i = 0; i < e.endpoints.size(); ++i) {
    const std::string h = host_of(e.endpoints[i]);
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
    if (h == my_host) {
      ++on_my_host;
      if (static_cast<int>(i) < e.rank) ++before_me_on_my_host;
    }
  }
  if (!hosts.empty() && on_my_host > 0) {
    e.nnodes = static_cast<int>(hosts.size());
    e.node_rank = static_cast<int>(std::find(hosts.begin(), hosts.end(), my_host) - hosts.begin());
    e.local_size = on_my_host;
    e.local_rank = before_me_on_my_host;
  } else {
    e.local_size = e.world_size;
    e.local_rank = e.rank;
  }
  if (const auto v = int_var(env, n, "PADDLE_RANK_IN_NODE")) e.local_rank = *v;
  if (const auto* gpus = lookup(env, "FLAGS_selected_gpus")) {
    const auto ids = split(*gpus, ',');
    if (ids.empty() || !parse_integer(ids[0]) || *parse_integer(ids[0]) < 0) {
      fail(n, "FLAGS_selected_gpus='" + *gpus + "' is not a list of GPU ids");
    }
    e.device = "gpu:" + ids[0];
  }
  if (const auto* job = lookup(env, "PADDLE_JOB_ID")) e.job_id = *job;
  validate(e, n);
  return e;
}

// First host of a Slurm host list in its simple forms: "n1", "n1,n2", "n[01-04,07]",
// "rack[1-2]-n[3-4]" (each bracket group contributes its first value, zero padding kept).
std::string first_slurm_host(const Names& n, const std::string& var, const std::string& list) {
  std::string out;
  int depth = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == '[') {
      if (depth++ > 0) break;
      // Copy the first range's start: digits up to '-', ',' or ']'.
      size_t j = i + 1;
      while (j < list.size() && list[j] != '-' && list[j] != ',' && list[j] != ']')
        out += list[j++];
      continue;
    }
    if (c == ']') {
      if (--depth < 0) break;
      continue;
    }
    if (depth > 0) continue;
    if (c == ',') break;
    out += c;
  }
  if (out.empty() || depth != 0 || out.find_first_of("[]") != std::string::npos) {
    fail(n, var + "='" + list + "' is not a host list this parser understands; set MASTER_ADDR");
  }
  return out;
}

// Tasks on node `node` from "2(x3),1" (SLURM_STEP_TASKS_PER_NODE's format).
std::optional<int> slurm_tasks_on_node(const std::string& spec, int node) {
  int index = 0;
  for (const auto& item : split(spec, ',')) {
    const size_t paren = item.find("(x");
    const auto count = parse_integer(item.substr(0, paren));
    long long repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') return std::nullopt;
      const auto r = parse_integer(item.substr(paren + 2, item.size() - paren - 3));
      if (!r) return std::nullopt;
      repeat = *r;
    }
    if (!count) return std::nullopt;
    if (node < index + repeat) return static_cast<int>(*count);
    index += static_cast<int>(repeat);
  }
  return std::nullopt;
}

ParallelEnv parse_slurm(const Env& env) {
  const bool step = has(env, "SLURM_STEP_NUM_TASKS");
  Names n{"slurm",
          "SLURM_PROCID",
          step ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS",
          "SLURM_LOCALID",
          "tasks per node",
          "SLURM_NODEID",
          has(env, "SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES",
          "",
          "",
          "MASTER_ADDR/MASTER_PORT or SLURM_STEP_NODELIST/SLURM_JOB_NODELIST and SLURM_JOB_ID"};
  ParallelEnv e;
  e.source = "slurm";
  e.rank = required_int(env, n, "SLURM_PROCID", "srun sets SLURM_PROCID");
  e.world_size = required_int(env, n, n.world, "srun sets the task count");
  e.nnodes = int_var(env, n, n.nnodes).value_or(1);
  e.node_rank = int_var(env, n, "SLURM_NODEID").value_or(0);
  e.local_rank = int_var(env, n, "SLURM_LOCALID").value_or(0);
  std::optional<int> local;
  for (const char* key : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (const auto* spec = lookup(env, key)) {
      local = slurm_tasks_on_node(*spec, e.node_rank);
      if (local) {
        n.local_size = std::string(key) + "='" + *spec + "' (for this node)";
        break;
      }
    }
  }
  e.local_size = local.value_or((e.world_size + e.nnodes - 1) / std::max(1, e.nnodes));
  if (const auto* job = lookup(env, "SLURM_JOB_ID")) e.job_id = *job;
  e.master_addr.clear();
  if (!master_from_env(env, n, e) && e.world_size > 1) {
    const char* list_var =
        has(env, "SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    const auto* list = lookup(env, list_var);
    if (!list) {
      fail(n, n.world + "=" + std::to_string(e.world_size) +
                  " needs a master for the store: set MASTER_ADDR and MASTER_PORT (no "
                  "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST either)");
    }
    e.master_addr = first_slurm_host(n, list_var, *list);
    const auto* job = lookup(env, "SLURM_JOB_ID");
    if (!job) fail(n, "no MASTER_PORT and no SLURM_JOB_ID to derive the store port from");
    const auto id = parse_integer(*job);
    if (!id || *id < 0) fail(n, "SLURM_JOB_ID='" + *job + "' is not a non-negative integer");
    e.master_port = static_cast<int>(15000 + *id % 15000);
  }
  validate(e, n);
  return e;
}

ParallelEnv parse_openmpi(const Env& env) {
  Names n{"openmpi",
          "OMPI_COMM_WORLD_RANK",
          "OMPI_COMM_WORLD_SIZE",
          "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE",
          "node rank",
          "node count",
          "",
          "",
          "MASTER_ADDR and MASTER_PORT (e.g. mpirun -x MASTER_ADDR=<rank 0 host> -x "
          "MASTER_PORT=<free port>)"};
  ParallelEnv e;
  e.source = "openmpi";
  const char* why = "mpirun sets OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE";
  e.rank = required_int(env, n, "OMPI_COMM_WORLD_RANK", why);
  e.world_size = required_int(env, n, "OMPI_COMM_WORLD_SIZE", why);
  e.local_size = int_var(env, n, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(e.world_size);
  e.local_rank = int_var(env, n, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(e.rank);
  // Node layout assuming mpirun's default by-slot mapping (consecutive ranks share a node).
  const int per_node = std::max(1, e.local_size);
  e.nnodes = (e.world_size + per_node - 1) / per_node;
  e.node_rank = std::min(e.rank / per_node, e.nnodes - 1);
  if (const auto* job = lookup(env, "OMPI_MCA_ess_base_jobid")) e.job_id = "ompi-" + *job;
  e.master_addr.clear();
  master_from_env(env, n, e);
  validate(e, n);
  return e;
}

}  // namespace

ParallelEnv parse_parallel_env(const Env& env) {
  if (has(env, "DPAR_RANK") || has(env, "DPAR_WORLD_SIZE")) return parse_dpar(env);
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) return parse_torchrun(env);
  if (has(env, "PADDLE_TRAINER_ID") || has(env, "PADDLE_TRAINERS_NUM")) return parse_paddle(env);
  if (has(env, "SLURM_PROCID")) return parse_slurm(env);
  if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) {
    return parse_openmpi(env);
  }
  return ParallelEnv{};
}

std::map<std::string, std::string> current_environment() {
  Env env;
  for (char** p = environ; p && *p; ++p) {
    const std::string entry(*p);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

}  // namespace dpar::dist
