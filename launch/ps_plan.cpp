// Parameter-server mode (--run_mode=ps): the job's servers and trainers, the nodes they make,
// the job id and the job token. The scheme is described in plan.h.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>

#include "address.h"
#include "dpar/core/error.h"
#include "dpar/core/flags.h"
#include "plan.h"
#include "text.h"

namespace dpar::launch {
namespace {

[[noreturn]] void bad(const std::string& message) { throw FlagError("dpar-launch: " + message); }

std::string to_hex(const unsigned char* bytes, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

std::string random_token() {
  unsigned char bytes[16];
  size_t got = 0;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const int open_errno = errno;
  while (fd >= 0 && got < sizeof bytes) {
    const ssize_t n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (fd >= 0) ::close(fd);
  DPAR_CHECK(got == sizeof bytes, "dpar-launch: cannot read /dev/urandom for the job token",
             fd < 0 ? std::string(": ") + std::strerror(open_errno) : std::string());
  return to_hex(bytes, sizeof bytes);
}

// The node running `ip`, appended when it is the first process there.
Node& node_for(Cluster& cluster, const std::string& ip) {
  for (Node& node : cluster.nodes) {
    if (node.ip == ip) return node;
  }
  Node node;
  node.host = ip;
  node.ip = ip;
  cluster.nodes.push_back(std::move(node));
  return cluster.nodes.back();
}

std::string ip_of(const std::string& endpoint) { return endpoint.substr(0, endpoint.rfind(':')); }

}  // namespace

std::vector<std::string> parse_server_list(const std::string& text) {
  const std::string flag = "--servers=" + text;
  std::vector<std::string> out;
  std::map<std::string, size_t> seen;  // endpoint -> server id
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) bad(flag + ": empty entry (expected --servers=ip:port,ip:port)");
    std::string ip;
    int port = 0;
    if (!split_endpoint(item, &ip, &port) || !is_ipv4(ip)) {
      bad(flag + ": entry '" + item +
          "': expected ip:port (an IPv4 address and a port in 1..65535)");
    }
    const std::string endpoint = ip + ":" + std::to_string(port);
    if (auto [it, inserted] = seen.emplace(endpoint, out.size()); !inserted) {
      bad(flag + ": duplicate server endpoint " + endpoint + " (servers " +
          std::to_string(it->second) + " and " + std::to_string(out.size()) + ")");
    }
    out.push_back(endpoint);
  }
  if (out.empty()) bad(flag + ": lists no servers (expected --servers=ip:port,ip:port)");
  return out;
}

std::vector<std::string> parse_trainer_list(const std::string& text) {
  const std::string flag = "--trainers=" + text;
  std::vector<std::string> out;
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) bad(flag + ": empty entry (expected --trainers=ip,ip: one per trainer)");
    // PaddlePaddle users write trainer endpoints; the port means nothing here.
    std::string ip = item;
    int port = 0;
    const bool endpoint_ok =
        item.find(':') == std::string::npos || split_endpoint(item, &ip, &port);
    if (!endpoint_ok || !is_ipv4(ip)) {
      bad(flag + ": entry '" + item +
          "': expected an IPv4 address (or ip:port; the port is not used)");
    }
    out.push_back(ip);
  }
  if (out.empty()) bad(flag + ": lists no trainers (expected --trainers=ip,ip)");
  return out;
}

std::string derived_job_token(const std::string& job_id) {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a, 64 bit
  for (unsigned char c : "dpar-ps-token/" + job_id) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string choose_job_token(const std::string& given, bool single_node, const std::string& job_id,
                             bool* derived) {
  *derived = false;
  if (!given.empty()) return given;
  if (single_node) return random_token();
  *derived = true;
  return derived_job_token(job_id);
}

LaunchPlan make_ps_plan(const Options& o, const std::vector<std::string>& local_addresses) {
  LaunchPlan plan;
  plan.ps_mode = true;
  plan.start_port = static_cast<int>(o.start_port);

  // --server_num / --trainer_num place their processes on the one --ips node.
  const bool uses_ips = !o.servers_given || !o.trainers_given;
  std::string single_ip;
  if (uses_ips) {
    const std::vector<std::string> ips = split(o.ips, ',');
    if (ips.size() != 1 || !is_ipv4(ips[0])) {
      bad("--ips=" + o.ips +
          ": --server_num/--trainer_num run on one node, so expected one IPv4 address "
          "(several nodes: --servers=ip:port,... --trainers=ip,...)");
    }
    single_ip = ips[0];
  }

  if (o.servers_given) {
    plan.servers = parse_server_list(o.servers);
    if (o.server_num_given && o.server_num != static_cast<int64_t>(plan.servers.size())) {
      bad("--server_num=" + std::to_string(o.server_num) + " but --servers=" + o.servers +
          " lists " + std::to_string(plan.servers.size()) +
          " server(s); give one of the two or make them agree");
    }
  } else {
    const int count = static_cast<int>(o.server_num);
    if (plan.start_port + count - 1 > 65535) {
      bad("--start_port=" + std::to_string(plan.start_port) + ": the " + std::to_string(count) +
          " servers need ports " + std::to_string(plan.start_port) + ".." +
          std::to_string(plan.start_port + count - 1) + ", past 65535");
    }
    for (int i = 0; i < count; ++i) {
      plan.servers.push_back(single_ip + ":" + std::to_string(plan.start_port + i));
    }
  }

  std::vector<std::string> trainers;
  if (o.trainers_given) {
    trainers = parse_trainer_list(o.trainers);
    if (o.trainer_num_given && o.trainer_num != static_cast<int64_t>(trainers.size())) {
      bad("--trainer_num=" + std::to_string(o.trainer_num) + " but --trainers=" + o.trainers +
          " lists " + std::to_string(trainers.size()) +
          " trainer(s); give one of the two or make them agree");
    }
  } else {
    trainers.assign(static_cast<size_t>(o.trainer_num), single_ip);
  }
  plan.trainers_num = static_cast<int>(trainers.size());

  Cluster& cluster = plan.cluster;
  std::vector<std::string> source;
  if (o.servers_given) source.push_back("--servers=" + o.servers);
  if (o.trainers_given) source.push_back("--trainers=" + o.trainers);
  if (uses_ips) source.push_back("--ips=" + single_ip);
  cluster.source = join(source, " ");
  // Servers first, so each node runs its servers and then its trainers.
  for (size_t id = 0; id < plan.servers.size(); ++id) {
    Process p;
    p.role = Role::kServer;
    p.role_id = static_cast<int>(id);
    p.endpoint = plan.servers[id];
    node_for(cluster, ip_of(p.endpoint)).procs.push_back(p);
  }
  for (size_t id = 0; id < trainers.size(); ++id) {
    Process p;
    p.role = Role::kTrainer;
    p.role_id = static_cast<int>(id);
    node_for(cluster, trainers[id]).procs.push_back(p);
  }
  int rank = 0;
  for (Node& node : cluster.nodes) {
    int servers = 0, local_trainers = 0;
    for (size_t i = 0; i < node.procs.size(); ++i) {
      Process& p = node.procs[i];
      p.rank = rank++;
      p.local_rank = static_cast<int>(i);
      p.role_local = p.role == Role::kServer ? servers++ : local_trainers++;
    }
  }
  plan.node_rank = select_node(cluster, o.host, static_cast<int>(o.node_rank), local_addresses);

  const std::string& first = plan.servers.front();
  plan.job_id = o.job_id.empty()
                    ? "dpar-ps-" + ip_of(first) + "-" + first.substr(first.rfind(':') + 1)
                    : o.job_id;
  plan.command = o.command;
  plan.log_dir = o.log_dir;
  plan.max_restarts = static_cast<int>(o.max_restarts);
  plan.grace_period = o.grace_period;
  plan.server_stop_timeout = o.server_stop_timeout;
  return plan;
}

}  // namespace dpar::launch
