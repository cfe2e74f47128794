// MindSpore-style rank tables (the HCCL "rank_table_file" layout):
//   {"server_list": [{"server_id": "10.0.0.1",
//                     "device": [{"device_id": "0", "rank_id": "0"}, ...]}, ...]}
// Other fields (version, server_count, device_ip, host_nic_ip, status) are accepted and not
// needed here.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "address.h"
#include "cluster.h"
#include "dpar/core/flags.h"
#include "text.h"

namespace dpar::launch {
namespace {

using nlohmann::json;

// A non-negative id written either as a number or as a string of digits.
int read_id(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) throw FlagError(where + "." + key + " is missing");
  if (it->is_number_unsigned()) {
    const auto value = it->get<uint64_t>();
    if (value <= 1000000) return static_cast<int>(value);
  } else if (it->is_string()) {
    const std::string text = trim(it->get<std::string>());
    if (is_uint(text) && text.size() <= 6) return std::stoi(text);
  }
  throw FlagError(where + "." + key + " is " + it->dump() + " (expected a non-negative id)");
}

}  // namespace

Cluster cluster_from_rank_table(const std::string& text, const std::string& name) {
  const std::string prefix = "dpar-launch: rank table " + name + ": ";
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for huge numbers
    throw FlagError(prefix + "not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_object() || !doc.contains("server_list") || !doc["server_list"].is_array() ||
      doc["server_list"].empty()) {
    throw FlagError(prefix + "expected an object with a non-empty \"server_list\" array");
  }
  Cluster cluster;
  cluster.source = "--rank_table=" + name;
  std::set<int> ranks;
  const json& servers = doc["server_list"];
  for (size_t s = 0; s < servers.size(); ++s) {
    const std::string where = prefix + "server_list[" + std::to_string(s) + "]";
    const json& server = servers[s];
    if (!server.is_object()) throw FlagError(where + " is not an object");
    auto id = server.find("server_id");
    if (id == server.end() || !id->is_string()) {
      throw FlagError(where + ".server_id is missing (expected the node's IP address)");
    }
    Node node;
    node.host = id->get<std::string>();
    node.ip = resolve_ipv4(node.host);
    if (node.ip.empty()) {
      throw FlagError(where + ".server_id '" + node.host +
                      "' is not an IPv4 address or a host name");
    }
    auto devices = server.find("device");
    if (devices == server.end() || !devices->is_array() || devices->empty()) {
      throw FlagError(where + ".device is missing or empty");
    }
    std::set<int> gpus;
    for (size_t d = 0; d < devices->size(); ++d) {
      const std::string dwhere = where + ".device[" + std::to_string(d) + "]";
      const json& device = (*devices)[d];
      if (!device.is_object()) throw FlagError(dwhere + " is not an object");
      Process p;
      const int gpu = read_id(device, "device_id", dwhere);
      p.rank = read_id(device, "rank_id", dwhere);
      if (!gpus.insert(gpu).second) {
        throw FlagError(dwhere + ".device_id " + std::to_string(gpu) + " appears twice on " +
                        node.host);
      }
      if (!ranks.insert(p.rank).second) {
        throw FlagError(dwhere + ".rank_id " + std::to_string(p.rank) + " appears twice");
      }
      p.gpu = std::to_string(gpu);
      node.procs.push_back(p);
    }
    std::sort(node.procs.begin(), node.procs.end(),
              [](const Process& a, const Process& b) { return a.rank < b.rank; });
    for (size_t i = 0; i < node.procs.size(); ++i) node.procs[i].local_rank = static_cast<int>(i);
    cluster.nodes.push_back(std::move(node));
  }
  // The set is ordered, so the ranks are 0..N-1 exactly when the largest is N-1.
  if (*ranks.rbegin() != static_cast<int>(ranks.size()) - 1) {
    int missing = 0;
    while (ranks.count(missing)) ++missing;
    throw FlagError(prefix + "rank_id values must be 0.." + std::to_string(ranks.size() - 1) +
                    " (one per device); rank " + std::to_string(missing) + " is missing");
  }
  return cluster;
}

}  // namespace dpar::launch
