// CheckpointManager (directory layout, rotation, latest/best, resume lookup) and the
// rank-0 load that every rank of a job shares.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "dpar/distributed/parallel_env.h"
#include "dpar/io/checkpoint.h"
#include "io/checkpoint_format.h"

namespace fs = std::filesystem;

namespace dpar::io {
namespace {

using Json = nlohmann::ordered_json;

bool is_rotating_name(const std::string& filename) {
  static const std::regex pattern(R"((model|step)_[0-9]+\.ckpt)");
  return std::regex_match(filename, pattern);
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, CheckpointManagerOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  DPAR_CHECK(!dir_.empty(), "CheckpointManager: the checkpoint directory must not be empty");
  DPAR_CHECK(options_.max_num_checkpoints >= 0,
             "CheckpointManager: max_num_checkpoints must be >= 0 (0 keeps all), got ",
             options_.max_num_checkpoints);
  if (!writes() || options_.on_existing == OnExisting::read_only) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  DPAR_CHECK(!ec && fs::is_directory(dir_), "CheckpointManager: cannot create directory ", dir_,
             ": ", ec ? ec.message() : std::string("exists and is not a directory"));
  const std::vector<std::string> existing = list();
  if (existing.empty()) return;
  switch (options_.on_existing) {
    case OnExisting::refuse: {
      std::string names;
      for (size_t i = 0; i < existing.size() && i < 3; ++i) {
        names += (i ? ", " : "") + fs::path(existing[i]).filename().string();
      }
      if (existing.size() > 3) names += ", ...";
      DPAR_FAIL(
          "CheckpointManager: ", dir_, " already holds ", existing.size(),
          " checkpoint(s) of an earlier run (", names,
          "); continue that run (CheckpointManagerOptions::on_existing = OnExisting::resume), "
          "replace it (OnExisting::overwrite) or use an empty folder");
    }
    case OnExisting::resume:
      adopt_existing(std::numeric_limits<int64_t>::max());
      return;
    case OnExisting::overwrite:
      for (const std::string& path : existing) {
        std::error_code rm;
        fs::remove(path, rm);
        DPAR_CHECK(!rm, "CheckpointManager: cannot remove ", path,
                   " of the earlier run: ", rm.message());
      }
      warn("removed " + std::to_string(existing.size()) + " checkpoint(s) of an earlier run from " +
           dir_ + " (on_existing = overwrite)");
      return;
    case OnExisting::read_only:
      return;
  }
}

void CheckpointManager::check_writable() const {
  DPAR_CHECK(options_.on_existing != OnExisting::read_only, "CheckpointManager: ", dir_,
             " was opened read_only; saving into it is not allowed");
}

std::string CheckpointManager::epoch_path(int64_t epoch) const {
  return (fs::path(dir_) / ("model_" + std::to_string(epoch) + kCheckpointExtension)).string();
}
std::string CheckpointManager::step_path(int64_t global_step) const {
  return (fs::path(dir_) / ("step_" + std::to_string(global_step) + kCheckpointExtension)).string();
}
std::string CheckpointManager::latest_path() const {
  return (fs::path(dir_) / (std::string("latest") + kCheckpointExtension)).string();
}
std::string CheckpointManager::best_path() const {
  return (fs::path(dir_) / (std::string("best") + kCheckpointExtension)).string();
}

void CheckpointManager::warn(const std::string& message) const {
  if (options_.warn) {
    options_.warn(message);
  } else {
    std::fprintf(stderr, "dpar: warning: %s\n", message.c_str());
    std::fflush(stderr);
  }
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == kCheckpointExtension) {
      out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string CheckpointManager::save_epoch(const Checkpoint& ckpt, int64_t epoch, bool is_best) {
  if (!writes()) return {};
  check_writable();
  const std::string path = epoch_path(epoch);
  save_checkpoint(path, ckpt, options_.progress);
  point(latest_path(), path, ckpt);
  if (is_best) point(best_path(), path, ckpt);
  rotate(path, ckpt.state.global_step);
  return path;
}

std::string CheckpointManager::save_step(const Checkpoint& ckpt) {
  if (!writes()) return {};
  check_writable();
  const std::string path = step_path(ckpt.state.global_step);
  save_checkpoint(path, ckpt, options_.progress);
  point(latest_path(), path, ckpt);
  rotate(path, ckpt.state.global_step);
  return path;
}

std::string CheckpointManager::save_best(const Checkpoint& ckpt) {
  if (!writes()) return {};
  check_writable();
  save_checkpoint(best_path(), ckpt, options_.progress);
  return best_path();
}

// latest/best name the same bytes as a rotating file: a hard link costs nothing and survives
// the rotation deleting the other name. The link is made under a temporary name and renamed,
// so readers see the old file or the new one. Without hard links, a second copy is written.
void CheckpointManager::point(const std::string& link, const std::string& target,
                              const Checkpoint& ckpt) {
  const std::string tmp = link + ".tmp";
  ::unlink(tmp.c_str());
  if (::link(target.c_str(), tmp.c_str()) == 0) {
    if (std::rename(tmp.c_str(), link.c_str()) == 0) {
      detail::sync_directory(dir_);
      return;
    }
    const int err = errno;
    ::unlink(tmp.c_str());
    DPAR_FAIL("CheckpointManager: cannot rename ", tmp, " to ", link, ": ", std::strerror(err));
  }
  save_checkpoint(link, ckpt, options_.progress);
}

void CheckpointManager::rotate(const std::string& path, int64_t global_step) {
  rotating_.erase(std::remove_if(rotating_.begin(), rotating_.end(),
                                 [&](const auto& e) { return e.second == path; }),
                  rotating_.end());
  rotating_.emplace_back(global_step, path);
  if (options_.max_num_checkpoints == 0) return;
  while (rotating_.size() > static_cast<size_t>(options_.max_num_checkpoints)) {
    std::error_code ec;
    fs::remove(rotating_.front().second, ec);
    if (ec) warn("cannot remove old checkpoint " + rotating_.front().second + ": " + ec.message());
    rotating_.erase(rotating_.begin());
  }
  remove_unreferenced_shard_sets();
}

std::string CheckpointManager::shard_set_path(int64_t global_step) const {
  return (fs::path(dir_) / ("optimizer_step_" + std::to_string(global_step))).string();
}

void CheckpointManager::remove_unreferenced_shard_sets() {
  std::set<std::string> named;
  for (const std::string& path : list()) {
    try {
      const TrainingState s = read_checkpoint_state(path);
      const auto it = s.extra.find(kOptimizerShardsKey);
      if (it != s.extra.end()) named.insert(it->second);
    } catch (const Error&) {
      // An unreadable file names nothing it could still be loaded with.
    }
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !name.starts_with("optimizer_step_") || name.ends_with(".tmp") ||
        named.count(name)) {
      continue;
    }
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
    if (rm)
      warn("cannot remove old optimizer shards " + entry.path().string() + ": " + rm.message());
  }
}

void CheckpointManager::adopt_existing(int64_t global_step) {
  if (!writes()) return;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 9 && name.ends_with(std::string(kCheckpointExtension) + ".tmp")) {
      warn("removing " + entry.path().string() + ", left by an interrupted checkpoint write");
      std::error_code rm;
      fs::remove(entry.path(), rm);
    }
    if (name.starts_with("optimizer_step_") && name.ends_with(".tmp")) {
      warn("removing " + entry.path().string() + ", left by an interrupted optimizer-shard write");
      std::error_code rm;
      fs::remove_all(entry.path(), rm);
    }
  }
  std::vector<std::pair<int64_t, std::string>> found;
  for (const std::string& path : list()) {
    if (!is_rotating_name(fs::path(path).filename().string())) continue;
    try {
      const TrainingState s = read_checkpoint_state(path);
      if (s.global_step <= global_step) found.emplace_back(s.global_step, path);
    } catch (const Error&) {
      // Unreadable files stay out of the rotation; load_latest_valid() reports them.
    }
  }
  std::sort(found.begin(), found.end());
  rotating_ = std::move(found);
}

std::optional<Checkpoint> CheckpointManager::load_latest_valid(std::string* path_out) const {
  const std::vector<std::string> files = list();
  if (files.empty()) return std::nullopt;
  struct Candidate {
    int64_t step;
    bool rotating;
    std::string path;
  };
  std::vector<Candidate> candidates;
  std::vector<std::string> bad;
  for (const std::string& path : files) {
    try {
      const TrainingState s = read_checkpoint_state(path);
      candidates.push_back(
          {s.global_step, is_rotating_name(fs::path(path).filename().string()), path});
    } catch (const Error& e) {
      warn(std::string("skipping unusable checkpoint: ") + e.what());
      bad.push_back(path);
    }
  }
  // Newest first; at equal steps the rotating name (latest/best are links to one of them).
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.rotating > b.rotating;
  });
  std::set<std::pair<dev_t, ino_t>> tried;
  for (const Candidate& c : candidates) {
    struct stat st {};
    if (::stat(c.path.c_str(), &st) == 0 && !tried.insert({st.st_dev, st.st_ino}).second) {
      continue;  // another name of a file already tried
    }
    try {
      Checkpoint ckpt = load_checkpoint(c.path);
      if (path_out) *path_out = c.path;
      return ckpt;
    } catch (const Error& e) {
      warn(std::string("skipping corrupt checkpoint: ") + e.what());
      bad.push_back(c.path);
    }
  }
  std::string names;
  for (const std::string& b : bad) names += (names.empty() ? "" : ", ") + b;
  DPAR_FAIL("no valid checkpoint in ", dir_, ": ", bad.size(), " file(s), all unusable: ", names);
}

std::optional<Checkpoint> load_on_rank0_and_broadcast(
    const std::function<std::optional<Checkpoint>()>& load) {
  if (dist::get_world_size() <= 1 || !dist::default_group_ptr()) return load();
  dist::Group& group = dist::default_group();
  const bool root = group.rank() == 0;

  std::optional<Checkpoint> result;
  std::string manifest;
  if (root) {
    Json m = Json::object();
    try {
      result = load();
      m["error"] = "";
    } catch (const std::exception& e) {
      m["error"] = e.what();
    }
    m["present"] = result.has_value();
    if (result) {
      m["state"] = detail::state_to_json(result->state);
      Json entries = Json::array();
      const nn::NamedTensors* groups[] = {&result->model, &result->optimizer, &result->scheduler};
      for (int g = 0; g < 3; ++g) {
        for (const auto& [name, t] : *groups[g]) {
          entries.push_back({g, name, std::string(dtype_name(t.dtype())), t.shape()});
        }
      }
      m["tensors"] = std::move(entries);
    }
    manifest = m.dump();
  }
  // Size, then the manifest text, then every tensor in one fused broadcast.
  Tensor size =
      Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(manifest.size())}, {1});
  group.broadcast({size}, 0, /*async_op=*/false);
  const int64_t n = size.to_int_vector()[0];
  Tensor text = Tensor::empty({n}, DType::u8);
  if (root) std::memcpy(text.raw_data(), manifest.data(), manifest.size());
  group.broadcast({text}, 0, /*async_op=*/false);
  if (!root) manifest.assign(static_cast<const char*>(text.raw_data()), static_cast<size_t>(n));

  const Json m = Json::parse(manifest);
  const std::string error = m.at("error").get<std::string>();
  if (!error.empty()) throw Error(error);
  if (!m.at("present").get<bool>()) return std::nullopt;

  std::vector<Tensor> payload;
  if (root) {
    for (auto* g : {&result->model, &result->optimizer, &result->scheduler}) {
      for (auto& entry : *g) payload.push_back(entry.second);
    }
  } else {
    result.emplace();
    result->state = detail::state_from_json(m.at("state").get<std::string>(), "(from rank 0)");
    nn::NamedTensors* groups[] = {&result->model, &result->optimizer, &result->scheduler};
    for (const Json& e : m.at("tensors")) {
      Tensor t =
          Tensor::empty(e.at(3).get<Shape>(),
                        detail::parse_dtype_name(e.at(2).get<std::string>(), "(from rank 0)"));
      groups[e.at(0).get<int>()]->emplace_back(e.at(1).get<std::string>(), t);
      payload.push_back(t);
    }
  }
  if (!payload.empty()) group.broadcast(payload, 0, /*async_op=*/false);
  return result;
}

}  // namespace dpar::io
