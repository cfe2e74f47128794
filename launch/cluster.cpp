#include "cluster.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "address.h"
#include "dpar/core/flags.h"
#include "text.h"

namespace dpar::launch {

int Cluster::world_size() const {
  int n = 0;
  for (const Node& node : nodes) n += static_cast<int>(node.procs.size());
  return n;
}

int Cluster::max_local_size() const {
  size_t n = 0;
  for (const Node& node : nodes) n = std::max(n, node.procs.size());
  return static_cast<int>(n);
}

std::string process_name(const Process& proc) {
  switch (proc.role) {
    case Role::kServer:
      return "server " + std::to_string(proc.role_id);
    case Role::kTrainer:
      return "trainer " + std::to_string(proc.role_id);
    case Role::kRank:
      break;
  }
  return "rank " + std::to_string(proc.rank);
}

std::string log_file_name(const Process& proc) {
  switch (proc.role) {
    case Role::kServer:
      return "serverlog." + std::to_string(proc.role_local);
    case Role::kTrainer:
      return "workerlog." + std::to_string(proc.role_local);
    case Role::kRank:
      break;
  }
  return "workerlog." + std::to_string(proc.local_rank);
}

std::vector<std::string> Node::gpus() const {
  std::vector<std::string> out;
  for (const Process& p : procs) {
    if (!p.gpu.empty() && std::find(out.begin(), out.end(), p.gpu) == out.end()) {
      out.push_back(p.gpu);
    }
  }
  return out;
}

std::vector<std::string> parse_gpu_list(const std::string& text, const std::string& flag) {
  auto bad = [&](const std::string& why) {
    throw FlagError("dpar-launch: " + flag + "=" + text + ": " + why);
  };
  std::vector<std::string> out;
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) bad("empty entry (expected GPU ids like 0,1,2)");
    if (!is_uint(item) || item.size() > 6) {
      bad("'" + item + "' is not a GPU id (expected GPU ids like 0,1,2)");
    }
    const std::string id = std::to_string(std::stoll(item));  // "01" and "1" are one GPU
    if (std::find(out.begin(), out.end(), id) != out.end()) bad("GPU " + id + " listed twice");
    out.push_back(id);
  }
  return out;
}

namespace {

// Numbers the processes of `nodes` node by node.
void assign_ranks_in_node_order(Cluster& cluster) {
  int rank = 0;
  for (Node& node : cluster.nodes) {
    for (Process& p : node.procs) p.rank = rank++;
  }
}

std::vector<Process> local_processes(int count, const std::vector<std::string>& gpus) {
  std::vector<Process> procs(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    procs[static_cast<size_t>(i)].local_rank = i;
    if (!gpus.empty())
      procs[static_cast<size_t>(i)].gpu = gpus[static_cast<size_t>(i) % gpus.size()];
  }
  return procs;
}

}  // namespace

Cluster cluster_from_ips(const std::string& ips, const std::vector<std::string>& gpus, int nproc) {
  Cluster cluster;
  cluster.source = "--ips=" + ips;
  for (const std::string& ip : split(ips, ',')) {
    if (ip.empty()) throw FlagError("dpar-launch: --ips=" + ips + ": empty entry");
    if (!is_ipv4(ip)) {
      throw FlagError("dpar-launch: --ips=" + ips + ": '" + ip +
                      "' is not an IPv4 address (expected --ips=10.0.0.1,10.0.0.2)");
    }
    Node node;
    node.host = ip;
    node.ip = ip;
    node.procs = local_processes(
        gpus.empty() ? nproc : std::max(nproc, static_cast<int>(gpus.size())), gpus);
    cluster.nodes.push_back(std::move(node));
  }
  assign_ranks_in_node_order(cluster);
  return cluster;
}

Cluster cluster_from_hostfile(const std::string& text, const std::string& name,
                              const std::vector<std::string>& gpus, int nproc) {
  Cluster cluster;
  cluster.source = "--hostfile=" + name;
  const int default_slots = gpus.empty() ? nproc : static_cast<int>(gpus.size());
  std::istringstream in(text);
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const std::string where =
        "dpar-launch: hostfile " + name + " line " + std::to_string(line_no) + ": ";
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<std::string> tokens = split_whitespace(line);
    std::string host = tokens[0];
    int slots = default_slots;
    // MPICH writes "host:N"; Open MPI and Horovod write "host slots=N".
    if (const size_t colon = host.find(':'); colon != std::string::npos) {
      const std::string count = host.substr(colon + 1);
      // Length before stoll: a 40-digit count is an error, not std::out_of_range (fuzz).
      if (!is_uint(count) || count.size() > 6 || std::stoll(count) < 1) {
        throw FlagError(where + "'" + tokens[0] + "': expected host:N with N >= 1");
      }
      slots = std::stoi(count);
      host = host.substr(0, colon);
    }
    for (size_t t = 1; t < tokens.size(); ++t) {
      const size_t eq = tokens[t].find('=');
      const std::string key = tokens[t].substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : tokens[t].substr(eq + 1);
      const bool count_ok = is_uint(value) && value.size() <= 6 && std::stoll(value) >= 1;
      if (key == "slots" && count_ok) {
        slots = std::stoi(value);
      } else if (key == "max_slots" && count_ok) {
        // Open MPI's oversubscription limit; the launcher starts exactly `slots` processes.
      } else if (key == "slots" || key == "max_slots") {
        throw FlagError(where + "'" + tokens[t] + "': expected " + key + "=N with N >= 1");
      } else {
        throw FlagError(where + "unknown field '" + tokens[t] + "' (expected 'host slots=N')");
      }
    }
    if (!gpus.empty() && slots > static_cast<int>(gpus.size())) {
      throw FlagError(where + "slots=" + std::to_string(slots) + " but --gpus lists only " +
                      std::to_string(gpus.size()) + " GPUs");
    }
    Node node;
    node.host = host;
    node.ip = resolve_ipv4(host);
    if (node.ip.empty()) {
      throw FlagError(where + "cannot resolve host '" + host + "' to an IPv4 address");
    }
    node.procs = local_processes(slots, gpus);
    cluster.nodes.push_back(std::move(node));
  }
  if (cluster.nodes.empty()) {
    throw FlagError("dpar-launch: hostfile " + name + " lists no hosts");
  }
  assign_ranks_in_node_order(cluster);
  return cluster;
}

std::string read_text_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FlagError("dpar-launch: " + flag + "=" + path + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw FlagError("dpar-launch: " + flag + "=" + path + ": cannot read the file");
  return text.str();
}

}  // namespace dpar::launch
