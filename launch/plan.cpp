#include "plan.h"

#include <algorithm>
#include <map>

#include "address.h"
#include "dpar/core/flags.h"
#include "text.h"

namespace dpar::launch {
namespace {

[[noreturn]] void bad(const std::string& message) { throw FlagError("dpar-launch: " + message); }

const Node& node_of_rank(const Cluster& cluster, int rank) {
  for (const Node& node : cluster.nodes) {
    for (const Process& p : node.procs) {
      if (p.rank == rank) return node;
    }
  }
  bad("internal: no node runs rank " + std::to_string(rank));
}

Cluster build_cluster(const Options& o) {
  std::vector<std::string> gpus;
  if (o.gpus_given) gpus = parse_gpu_list(o.gpus, "--gpus");
  // One process per GPU, or (--nproc_per_node a multiple of the GPUs) several ranks per GPU,
  // as when testing many ranks on a one-GPU machine.
  if (!gpus.empty() && o.nproc_given && o.nproc_per_node % static_cast<int64_t>(gpus.size()) != 0) {
    bad("--nproc_per_node=" + std::to_string(o.nproc_per_node) +
        " does not match --gpus=" + o.gpus + " (one process per GPU, or a multiple of the " +
        std::to_string(gpus.size()) + " GPUs to share them; give one of the two)");
  }
  const int nproc = !gpus.empty() && !o.nproc_given ? static_cast<int>(gpus.size())
                                                    : static_cast<int>(o.nproc_per_node);
  if (!o.rank_table.empty()) {
    return cluster_from_rank_table(read_text_file(o.rank_table, "--rank_table"), o.rank_table);
  }
  if (!o.hostfile.empty()) {
    return cluster_from_hostfile(read_text_file(o.hostfile, "--hostfile"), o.hostfile, gpus, nproc);
  }
  return cluster_from_ips(o.ips, gpus, nproc);
}

// Two nodes with one address would give two ranks one endpoint; say so in the input's terms.
void check_distinct_nodes(const Cluster& cluster) {
  std::map<std::string, size_t> seen;
  for (size_t n = 0; n < cluster.nodes.size(); ++n) {
    const Node& node = cluster.nodes[n];
    auto [it, inserted] = seen.emplace(node.ip, n);
    if (!inserted) {
      bad(cluster.source + ": nodes " + std::to_string(it->second) + " and " + std::to_string(n) +
          " have the same address " + node.ip + ", so their ranks would get duplicate endpoints " +
          node.ip + ":<port>");
    }
  }
}

// torchrun's --nnodes is a count; dpar derives every rank's endpoint from the nodes' addresses,
// so the count must agree with the node list rather than replace it.
void check_node_count(const Options& o, const Cluster& cluster) {
  const auto listed = static_cast<int64_t>(cluster.nodes.size());
  if (o.nnodes == 0 || o.nnodes == listed) return;
  if (!o.ips_given && o.hostfile.empty() && o.rank_table.empty()) {
    bad("--nnodes=" + std::to_string(o.nnodes) + " needs the nodes' addresses: give --ips=" +
        "<node 0>,<node 1>,... (the same list on every node; dpar-launch derives each rank's "
        "endpoint from it) or --hostfile");
  }
  bad("--nnodes=" + std::to_string(o.nnodes) + " but " + cluster.source + " lists " +
      std::to_string(listed) + " node(s)");
}

// --standalone without --start_port: the first block of `count` consecutive free ports from
// 29500 on (torchrun's default master port), so two standalone jobs on one machine coexist.
int free_port_block(const std::string& ip, int count) {
  for (int first = 29500; first + count <= 65535; first += count) {
    bool all_free = true;
    for (int p = first; p < first + count && all_free; ++p) all_free = probe_port(ip, p).empty();
    if (all_free) return first;
  }
  bad("--standalone: found no " + std::to_string(count) + " consecutive free ports on " + ip +
      " from 29500 on; give --start_port");
}

}  // namespace

bool LaunchPlan::hosts_rank0() const {
  for (const Process& p : node().procs) {
    if (p.rank == 0) return true;
  }
  return false;
}

int select_node(const Cluster& cluster, const std::string& host, int node_rank,
                const std::vector<std::string>& local_addresses) {
  const int nnodes = static_cast<int>(cluster.nodes.size());
  std::string host_ip;
  if (!host.empty()) {
    host_ip = resolve_ipv4(host);
    if (host_ip.empty()) bad("--host=" + host + ": not an IPv4 address or a known host name");
  }
  if (node_rank >= 0) {
    if (node_rank >= nnodes) {
      bad("--node_rank=" + std::to_string(node_rank) + ": " + cluster.source + " has " +
          std::to_string(nnodes) + " node(s), so expected 0.." + std::to_string(nnodes - 1));
    }
    const Node& node = cluster.nodes[static_cast<size_t>(node_rank)];
    if (!host.empty() && host_ip != node.ip) {
      bad("--host=" + host + " and --node_rank=" + std::to_string(node_rank) + " disagree: node " +
          std::to_string(node_rank) + " of " + cluster.source + " is " + node.ip);
    }
    return node_rank;
  }
  if (!host.empty()) {
    for (int n = 0; n < nnodes; ++n) {
      if (cluster.nodes[static_cast<size_t>(n)].ip == host_ip) return n;
    }
    bad("--host=" + host + " is not one of the nodes in " + cluster.source);
  }
  std::vector<int> matches;
  for (int n = 0; n < nnodes; ++n) {
    const std::string& ip = cluster.nodes[static_cast<size_t>(n)].ip;
    if (std::find(local_addresses.begin(), local_addresses.end(), ip) != local_addresses.end()) {
      matches.push_back(n);
    }
  }
  const std::string found = local_addresses.empty() ? "none" : join(local_addresses, ", ");
  if (matches.empty()) {
    bad("this host is not in " + cluster.source + " (local addresses: " + found +
        "); run it on one of those nodes or pass --host=<its ip> / --node_rank=<n>");
  }
  if (matches.size() > 1) {
    std::vector<std::string> ips;
    for (int n : matches) ips.push_back(cluster.nodes[static_cast<size_t>(n)].ip);
    bad("several nodes of " + cluster.source + " are addresses of this host (" + join(ips, ", ") +
        "); pass --host=<ip> or --node_rank=<n> to say which one this launcher is");
  }
  return matches[0];
}

int LaunchPlan::local_count(Role role) const {
  int n = 0;
  for (const Process& p : node().procs) n += p.role == role ? 1 : 0;
  return n;
}

int LaunchPlan::echo_local_rank() const {
  for (const Process& p : node().procs) {
    if (p.role == Role::kTrainer) return p.local_rank;
  }
  return 0;
}

// An elastic node is planned as a one-node job of its own processes (on --host, else loopback:
// the members bind where they reach the store); the rendezvous gives them ranks.
LaunchPlan make_elastic_plan(const Options& o) {
  Options node = o;
  node.ips = o.host.empty() ? "127.0.0.1" : o.host;
  node.host.clear();
  node.node_rank = 0;
  node.min_nodes = node.max_nodes = 0;
  node.rdzv_endpoint.clear();
  node.rdzv_id.clear();
  LaunchPlan plan = make_plan(node, {});
  const auto per_node = static_cast<int>(plan.node().procs.size());
  plan.elastic = true;
  plan.rdzv_backend = o.rdzv_backend;
  plan.rdzv_endpoint = join(split(o.rdzv_endpoint, ','), ",");  // "a:1, b:2" -> "a:1,b:2"
  plan.job_id = o.rdzv_id.empty() ? "dpar-elastic-" + o.rdzv_endpoint : o.rdzv_id;
  plan.min_members = static_cast<int>(o.min_nodes) * per_node;
  plan.max_members = static_cast<int>(o.max_nodes) * per_node;
  plan.elastic_timeout = o.elastic_timeout;
  return plan;
}

LaunchPlan make_plan(const Options& o, const std::vector<std::string>& local_addresses) {
  if (o.ps_mode()) return make_ps_plan(o, local_addresses);
  if (o.elastic()) return make_elastic_plan(o);
  LaunchPlan plan;
  plan.cluster = build_cluster(o);
  const Cluster& cluster = plan.cluster;
  if (cluster.world_size() < 1) bad(cluster.source + " describes no processes");
  check_distinct_nodes(cluster);
  check_node_count(o, cluster);
  // --standalone is the default --ips (loopback), so node 0 is this machine by definition.
  const int node_rank = o.standalone ? 0 : static_cast<int>(o.node_rank);
  plan.node_rank = select_node(cluster, o.host, node_rank, local_addresses);
  const int block = cluster.max_local_size();
  plan.start_port = o.standalone && !o.start_port_given ? free_port_block(plan.node().ip, block + 1)
                                                        : static_cast<int>(o.start_port);
  if (plan.start_port + block > 65535) {
    bad("--start_port=" + std::to_string(plan.start_port) + ": the endpoints and the store need " +
        "ports " + std::to_string(plan.start_port) + ".." +
        std::to_string(plan.start_port + block) + ", past 65535");
  }

  plan.endpoints.assign(static_cast<size_t>(cluster.world_size()), "");
  std::map<std::string, int> owner;  // endpoint -> rank, to catch duplicates
  for (const Node& node : cluster.nodes) {
    for (const Process& p : node.procs) {
      const std::string ep = node.ip + ":" + std::to_string(plan.start_port + p.local_rank);
      if (auto [it, inserted] = owner.emplace(ep, p.rank); !inserted) {
        bad("duplicate endpoint " + ep + " (ranks " + std::to_string(it->second) + " and " +
            std::to_string(p.rank) + ")");
      }
      plan.endpoints[static_cast<size_t>(p.rank)] = ep;
    }
  }

  if (o.master.empty() && o.master_addr.empty()) {
    plan.master_ip = node_of_rank(cluster, 0).ip;
    plan.master_port =
        o.master_port != 0 ? static_cast<int>(o.master_port) : plan.start_port + block;
  } else {
    // --master=ip:port, or torchrun's --master_addr with --master_port (default: derived).
    const std::string flag = o.master.empty() ? "--master_addr" : "--master";
    std::string host = o.master_addr;
    plan.master_port =
        o.master_port != 0 ? static_cast<int>(o.master_port) : plan.start_port + block;
    if (!o.master.empty() && !split_endpoint(o.master, &host, &plan.master_port)) {
      bad("--master=" + o.master + ": expected ip:port with a port in 1..65535");
    }
    plan.master_ip = resolve_ipv4(host);
    if (plan.master_ip.empty()) {
      bad(flag + "=" + (o.master.empty() ? o.master_addr : o.master) + ": '" + host +
          "' is not an IPv4 address or a known host name");
    }
  }
  if (auto it = owner.find(plan.master()); it != owner.end()) {
    const std::string what =
        !o.master.empty() ? "--master=" + o.master : "the store's endpoint " + plan.master();
    bad(what + " is also the endpoint of rank " + std::to_string(it->second) +
        " (duplicate endpoint); pick a port outside " + std::to_string(plan.start_port) + ".." +
        std::to_string(plan.start_port + block - 1));
  }
  plan.job_id = o.job_id.empty() ? "dpar-" + plan.master_ip + "-" + std::to_string(plan.master_port)
                                 : o.job_id;
  plan.gpu_source = o.gpus_given ? "--gpus=" + o.gpus : cluster.source;
  plan.command = o.command;
  plan.log_dir = o.log_dir;
  plan.max_restarts = static_cast<int>(o.max_restarts);
  plan.grace_period = o.grace_period;
  plan.bind_cpus = o.cpu_bind == "cores";
  return plan;
}

void check_ports_free(const LaunchPlan& plan) {
  if (plan.elastic) return;  // the members bind free ports; the store's host binds its own
  const Node& node = plan.node();
  if (plan.ps_mode) {
    for (const Process& p : node.procs) {
      if (p.role != Role::kServer) continue;
      std::string ip;
      int port = 0;
      split_endpoint(p.endpoint, &ip, &port);
      if (std::string why = probe_port(ip, port); !why.empty()) {
        bad("port " + std::to_string(port) + " on " + ip + " (endpoint of server " +
            std::to_string(p.role_id) + ") is not free: " + why +
            "; choose other --servers ports or another --start_port");
      }
    }
    return;
  }
  for (const Process& p : node.procs) {
    const int port = plan.start_port + p.local_rank;
    if (std::string why = probe_port(node.ip, port); !why.empty()) {
      bad("port " + std::to_string(port) + " on " + node.ip + " (endpoint of rank " +
          std::to_string(p.rank) + ") is not free: " + why + "; choose another --start_port");
    }
  }
  if (plan.hosts_rank0()) {
    if (std::string why = probe_port(plan.master_ip, plan.master_port); !why.empty()) {
      bad("port " + std::to_string(plan.master_port) + " on " + plan.master_ip +
          " (the store's endpoint, DPAR_MASTER) is not free: " + why +
          "; choose another --start_port or --master");
    }
  }
}

}  // namespace dpar::launch
