#include "dpar/ps/layout.h"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "dpar/core/error.h"

namespace dpar::ps {

ShardLayout::ShardLayout(const std::vector<std::pair<std::string, int64_t>>& params,
                         int num_servers, int64_t block_size)
    : num_servers_(num_servers), block_size_(block_size) {
  DPAR_CHECK(num_servers >= 1, "ps layout: expected at least one server, got ", num_servers);
  DPAR_CHECK(block_size >= 1, "ps layout: block size must be >= 1 element, got ", block_size);
  std::unordered_set<std::string> seen;
  for (const auto& [name, numel] : params) {
    DPAR_CHECK(numel >= 0, "ps layout: parameter '", name, "' has ", numel, " elements");
    DPAR_CHECK(seen.insert(name).second, "ps layout: parameter '", name, "' appears twice");
    params_.push_back({name, numel, total_});
    total_ += numel;
  }
}

ElementRange ShardLayout::shard(int server) const {
  DPAR_CHECK(server >= 0 && server < num_servers_, "ps layout: server ", server,
             " out of range 0..", num_servers_ - 1);
  // Server s gets blocks [floor(s*B/S), floor((s+1)*B/S)): whole blocks, counts differ by at
  // most one, and the ranges tile the vector in server order.
  const int64_t blocks = num_blocks();
  const int64_t first = blocks * server / num_servers_;
  const int64_t last = blocks * (server + 1) / num_servers_;
  return {std::min(total_, first * block_size_), std::min(total_, last * block_size_)};
}

std::string ShardLayout::first_difference(const ShardLayout& other) const {
  if (num_servers_ != other.num_servers_) {
    return "server count " + std::to_string(num_servers_) + " vs " +
           std::to_string(other.num_servers_);
  }
  if (block_size_ != other.block_size_) {
    return "block size " + std::to_string(block_size_) + " vs " + std::to_string(other.block_size_);
  }
  const size_t n = std::min(params_.size(), other.params_.size());
  for (size_t i = 0; i < n; ++i) {
    const ParamSlot& a = params_[i];
    const ParamSlot& b = other.params_[i];
    if (a.name != b.name || a.numel != b.numel) {
      return "parameter " + std::to_string(i) + ": '" + a.name + "' (" + std::to_string(a.numel) +
             " elements) vs '" + b.name + "' (" + std::to_string(b.numel) + " elements)";
    }
  }
  if (params_.size() != other.params_.size()) {
    const bool mine = params_.size() > other.params_.size();
    const ParamSlot& extra = mine ? params_[n] : other.params_[n];
    return std::to_string(params_.size()) + " vs " + std::to_string(other.params_.size()) +
           " parameters (first unmatched: '" + extra.name + "')";
  }
  return "";
}

std::string ShardLayout::describe() const {
  char head[160];
  std::snprintf(head, sizeof head, "%lld floats (%.1f MB) in %lld blocks of %lld over %d servers:",
                static_cast<long long>(total_), static_cast<double>(total_) * 4 / 1e6,
                static_cast<long long>(num_blocks()), static_cast<long long>(block_size_),
                num_servers_);
  std::string out = head;
  for (int s = 0; s < num_servers_; ++s) {
    const ElementRange r = shard(s);
    out += " [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
  }
  return out;
}

}  // namespace dpar::ps
