#include "cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "dpar/core/flags.h"

namespace dpar::launch {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  }
  return out;
}

std::vector<int> core_ids(const std::vector<int>& cpus) {
  std::vector<int> out;
  for (int cpu : cpus) {
    // "0,16" or "0-1": the first number is the core's first hardware thread.
    std::ifstream in("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                     "/topology/thread_siblings_list");
    int first = -1;
    out.push_back(in >> first && first >= 0 ? first : cpu);
  }
  return out;
}

std::vector<std::vector<int>> cpu_shares(const std::vector<int>& cpus, const std::vector<int>& core,
                                         int processes) {
  // The units to share out: physical cores (their CPUs, in order of their first CPU), or single
  // CPUs where there are fewer cores than processes.
  std::map<int, std::vector<int>> by_core;
  for (size_t i = 0; i < cpus.size(); ++i) by_core[core[i]].push_back(cpus[i]);
  std::vector<std::vector<int>> units;
  if (static_cast<int>(by_core.size()) >= processes) {
    for (auto& [id, members] : by_core) units.push_back(std::move(members));
    std::sort(units.begin(), units.end());
  } else {
    for (int cpu : cpus) units.push_back({cpu});
  }
  if (static_cast<int>(units.size()) < processes) {
    throw FlagError("dpar-launch: --cpu_bind=cores needs a CPU for each of this node's " +
                    std::to_string(processes) + " processes, but the launcher may use " +
                    std::to_string(cpus.size()) + " (CPUs " + cpu_list_text(cpus) + ")");
  }
  const size_t per = units.size() / static_cast<size_t>(processes);
  std::vector<std::vector<int>> shares(static_cast<size_t>(processes));
  for (size_t p = 0; p < shares.size(); ++p) {
    for (size_t u = p * per; u < (p + 1) * per; ++u) {
      shares[p].insert(shares[p].end(), units[u].begin(), units[u].end());
    }
    std::sort(shares[p].begin(), shares[p].end());
  }
  return shares;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    // append(), not "-" + to_string(): GCC 12 warns falsely (-Wrestrict) about the latter.
    if (!out.empty()) out.append(",");
    out.append(std::to_string(cpus[i]));
    if (j > i) out.append("-").append(std::to_string(cpus[j]));
    i = j + 1;
  }
  return out;
}

}  // namespace dpar::launch
