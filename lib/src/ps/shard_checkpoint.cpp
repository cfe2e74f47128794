#include "ps/shard_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <sstream>

#include "dpar/core/error.h"
#include "dpar/io/safetensors.h"

namespace dpar::ps::detail {
namespace {

namespace fs = std::filesystem;
constexpr char kFormat[] = "dpar-pserver-shard-1";
constexpr char kOptimizerPrefix[] = "optimizer/";

int64_t to_int(const io::Metadata& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  DPAR_CHECK(it != meta.end(), "ps checkpoint ", path, ": metadata lacks '", key, "'");
  int64_t value = 0;
  const std::string& s = it->second;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  DPAR_CHECK(ec == std::errc() && ptr == s.data() + s.size(), "ps checkpoint ", path,
             ": metadata '", key, "' is not an integer: '", s, "'");
  return value;
}

std::string text(const io::Metadata& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  DPAR_CHECK(it != meta.end(), "ps checkpoint ", path, ": metadata lacks '", key, "'");
  return it->second;
}

// This server's checkpoints in dir, oldest first.
std::vector<std::pair<int64_t, fs::path>> existing(const std::string& dir, int server_id) {
  std::vector<std::pair<int64_t, fs::path>> out;
  const std::string prefix = "pserver." + std::to_string(server_id) + ".step";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !name.ends_with(".safetensors")) continue;
    const std::string digits = name.substr(
        prefix.size(), name.size() - prefix.size() - std::string(".safetensors").size());
    int64_t step = 0;
    auto [ptr, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (err == std::errc() && ptr == digits.data() + digits.size())
      out.emplace_back(step, entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string shard_checkpoint_path(const std::string& dir, int server_id, int64_t step) {
  return (fs::path(dir) / ("pserver." + std::to_string(server_id) + ".step" + std::to_string(step) +
                           ".safetensors"))
      .string();
}

std::string write_shard_checkpoint(const std::string& dir, const ShardCheckpoint& ckpt, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DPAR_CHECK(!ec && fs::is_directory(dir), "ps checkpoint: cannot create directory ", dir, ": ",
             ec ? ec.message() : "a file is in the way");
  io::NamedTensors tensors{{"values", ckpt.values}};
  for (const auto& [key, tensor] : ckpt.optimizer_state) {
    tensors.emplace_back(kOptimizerPrefix + key, tensor);
  }
  std::ostringstream params;
  for (const ParamSlot& p : ckpt.layout.params()) params << p.name << ' ' << p.numel << '\n';
  const io::Metadata meta{{"format", kFormat},
                          {"server_id", std::to_string(ckpt.server_id)},
                          {"num_servers", std::to_string(ckpt.num_servers)},
                          {"step", std::to_string(ckpt.step)},
                          {"version", std::to_string(ckpt.version)},
                          {"block_size", std::to_string(ckpt.layout.block_size())},
                          {"params", params.str()},
                          {"mode", ckpt.mode},
                          {"optimizer", ckpt.optimizer}};
  const std::string path = shard_checkpoint_path(dir, ckpt.server_id, ckpt.step);
  io::save_safetensors(path, tensors, meta);
  if (keep > 0) {
    auto files = existing(dir, ckpt.server_id);
    for (size_t i = 0; i + static_cast<size_t>(keep) < files.size(); ++i) {
      fs::remove(files[i].second, ec);
    }
  }
  return path;
}

ShardCheckpoint read_shard_checkpoint(const std::string& path) {
  DPAR_CHECK(fs::exists(path), "ps checkpoint ", path,
             ": no such file (was it saved on this server's machine, at this step?)");
  io::SafetensorsContents contents = io::load_safetensors(path);
  const io::Metadata& meta = contents.metadata;
  DPAR_CHECK(text(meta, "format", path) == kFormat, "ps checkpoint ", path,
             ": not a dpar parameter-server shard (format '", text(meta, "format", path), "')");
  ShardCheckpoint ckpt;
  ckpt.server_id = static_cast<int>(to_int(meta, "server_id", path));
  ckpt.num_servers = static_cast<int>(to_int(meta, "num_servers", path));
  ckpt.step = to_int(meta, "step", path);
  ckpt.version = to_int(meta, "version", path);
  ckpt.mode = text(meta, "mode", path);
  ckpt.optimizer = text(meta, "optimizer", path);
  std::vector<std::pair<std::string, int64_t>> params;
  std::istringstream lines(text(meta, "params", path));
  std::string name;
  int64_t numel = 0;
  while (lines >> name >> numel) params.emplace_back(name, numel);
  ckpt.layout = ShardLayout(params, ckpt.num_servers, to_int(meta, "block_size", path));
  for (auto& [key, tensor] : contents.tensors) {
    if (key == "values") {
      ckpt.values = tensor;
    } else if (key.rfind(kOptimizerPrefix, 0) == 0) {
      ckpt.optimizer_state.emplace_back(key.substr(std::string(kOptimizerPrefix).size()), tensor);
    } else {
      DPAR_FAIL("ps checkpoint ", path, ": unexpected tensor '", key, "'");
    }
  }
  DPAR_CHECK(ckpt.values.defined(), "ps checkpoint ", path, ": no 'values' tensor");
  const int64_t expected = ckpt.layout.shard(ckpt.server_id).size();
  DPAR_CHECK(ckpt.values.numel() == expected, "ps checkpoint ", path, ": 'values' has ",
             ckpt.values.numel(), " elements, the layout gives this server ", expected);
  return ckpt;
}

}  // namespace dpar::ps::detail
