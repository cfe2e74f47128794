#include "flight_verdict.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "text.h"

namespace dpar::launch {
namespace {

namespace fs = std::filesystem;

FlightRecord parse_record(const nlohmann::json& j) {
  FlightRecord r;
  r.rank = j.at("rank").get<int>();
  r.reason = j.value("reason", "");
  r.time_us = j.value("time_us", int64_t{0});
  for (const auto& g : j.at("groups")) {
    FlightGroup group;
    group.name = g.at("group").get<std::string>();
    group.size = g.value("size", 0);
    for (const auto& e : g.at("entries")) {
      FlightEntry entry;
      entry.seq = e.at("seq").get<int64_t>();
      entry.call = e.value("call", "?");
      entry.label = e.value("label", "");
      entry.state = e.value("state", "");
      entry.started_us = e.value("started_us", int64_t{0});
      group.entries.push_back(std::move(entry));
    }
    std::sort(group.entries.begin(), group.entries.end(),
              [](const FlightEntry& a, const FlightEntry& b) { return a.seq < b.seq; });
    r.groups.push_back(std::move(group));
  }
  return r;
}

std::string call_text(const FlightEntry& e) {
  std::string text = e.call + " #" + std::to_string(e.seq);
  if (!e.label.empty()) text += " (" + e.label + ")";
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> items;
  for (int r : ranks) items.push_back(std::to_string(r));
  return (ranks.size() == 1 ? "rank " : "ranks ") + join(items, ", ");
}

std::string seconds_text(int64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(us) / 1e6);
  return buf;
}

// One rank's view of one group.
struct RankView {
  int rank = -1;
  int64_t record_us = 0;
  const FlightGroup* group = nullptr;
  // The last collective it started (seq 0: none), and whether that one is still running or
  // failed (the rank waits in it).
  const FlightEntry* last = nullptr;
  bool waiting = false;
};

RankView view_of(const FlightRecord& record, const FlightGroup& group) {
  RankView v{record.rank, record.time_us, &group, nullptr, false};
  for (const FlightEntry& e : group.entries) {
    if (e.state == "queued") continue;
    if (v.last == nullptr || e.seq > v.last->seq) v.last = &e;
  }
  v.waiting = v.last != nullptr && (v.last->state == "started" || v.last->state == "failed");
  return v;
}

// The first position at which ranks recorded different calls, as a verdict line; "" if none.
std::string first_mismatch(const std::string& name, const std::vector<RankView>& views) {
  std::map<int64_t, std::map<std::string, std::vector<int>>> calls;  // seq -> call -> ranks
  for (const RankView& v : views) {
    for (const FlightEntry& e : v.group->entries) calls[e.seq][e.call].push_back(v.rank);
  }
  for (const auto& [seq, by_call] : calls) {
    if (by_call.size() < 2) continue;
    std::string line = "ranks disagree at #" + std::to_string(seq) + " of " + name + ": ";
    bool first = true;
    for (const auto& [call, ranks] : by_call) {
      line += (first ? "" : "; ") + rank_list(ranks) + " called " + call;
      first = false;
    }
    return line;
  }
  return "";
}

std::vector<std::string> group_verdict(const std::string& name, const std::vector<RankView>& views,
                                       int world_size,
                                       const std::map<int, std::string>& without_record) {
  if (std::string mismatch = first_mismatch(name, views); !mismatch.empty()) return {mismatch};
  int64_t furthest = 0;
  for (const RankView& v : views) furthest = std::max(furthest, v.last ? v.last->seq : 0);
  std::vector<std::string> lines;
  std::vector<int> waiting;
  const FlightEntry* waited_in = nullptr;
  int64_t waited_us = 0;
  for (const RankView& v : views) {
    if (v.waiting && v.last->seq == furthest) {
      waiting.push_back(v.rank);
      waited_in = v.last;
      waited_us = std::max(waited_us, v.record_us - v.last->started_us);
    }
  }
  for (const RankView& v : views) {
    if ((v.last ? v.last->seq : 0) >= furthest) continue;
    std::string line = "in " + name + ", rank " + std::to_string(v.rank) + " is behind: ";
    line += v.last ? "its last collective is " + call_text(*v.last) + " (" + v.last->state + ")"
                   : "it has run no collective in this group";
    lines.push_back(line);
  }
  std::set<int> recorded;
  for (const RankView& v : views) recorded.insert(v.rank);
  std::vector<int> silent;
  for (int r = 0; r < world_size; ++r) {
    if (!recorded.count(r)) silent.push_back(r);
  }
  if (!waiting.empty()) {
    std::string line = rank_list(waiting) + (waiting.size() == 1 ? " waits" : " wait") + " in " +
                       call_text(*waited_in) + " of " + name + " (for " + seconds_text(waited_us) +
                       " when recorded)";
    if (lines.empty() && silent.empty()) {
      line += "; every recorded rank is in it: the collective itself is stuck or failed";
    }
    lines.push_back(line);
  } else if (lines.empty() && silent.empty() && furthest > 0) {
    lines.push_back("every rank finished its last collective in " + name + " (#" +
                    std::to_string(furthest) + "): the failure lies outside the collectives");
  }
  for (int r : silent) {
    const auto it = without_record.find(r);
    std::string line = "rank " + std::to_string(r) + " left no flight record";
    if (it != without_record.end()) line += " (" + it->second + ")";
    if (!waiting.empty()) line += ": the ranks in " + name + " may be waiting for it";
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

std::vector<FlightRecord> read_flight_records(const std::string& dir,
                                              std::vector<std::string>* problems) {
  std::vector<FlightRecord> records;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return records;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank", 0) == 0 && entry.path().extension() == ".json") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& path : files) {
    try {
      std::ifstream in(path);
      records.push_back(parse_record(nlohmann::json::parse(in)));
    } catch (const std::exception& e) {
      if (problems) problems->push_back(path.string() + ": unreadable flight record: " + e.what());
    }
  }
  std::sort(records.begin(), records.end(),
            [](const FlightRecord& a, const FlightRecord& b) { return a.rank < b.rank; });
  return records;
}

std::vector<std::string> flight_verdict(const std::vector<FlightRecord>& records, int world_size,
                                        const std::map<int, std::string>& without_record) {
  std::map<std::string, std::vector<RankView>> by_group;
  for (const FlightRecord& record : records) {
    for (const FlightGroup& group : record.groups) {
      by_group[group.name].push_back(view_of(record, group));
    }
  }
  std::vector<std::string> lines;
  for (const auto& [name, views] : by_group) {
    // A world of one has nothing to wait for.
    if (name.size() >= 6 && name.compare(name.size() - 6, 6, "/local") == 0) continue;
    for (std::string& line : group_verdict(name, views, world_size, without_record)) {
      lines.push_back(std::move(line));
    }
  }
  if (by_group.empty()) {
    std::string line = "no rank left a flight record";
    if (!without_record.empty()) {
      line += " (";
      bool first = true;
      for (const auto& [rank, state] : without_record) {
        line += (first ? "rank " : "; rank ") + std::to_string(rank) + ": " + state;
        first = false;
      }
      line += ")";
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace dpar::launch
