// Optimizer shard sets: writing one collectively, and re-cutting any stored layout (a shard set
// of any number of ranks, or a whole-parameter state dict) for the layout of this rank.
#include "dpar/distributed/optimizer_shards.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/crc32c.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/io/safetensors.h"
#include "io/checkpoint_format.h"

namespace dpar::dist {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormat = "dpar.optimizer_shards";
constexpr int kVersion = 1;
constexpr const char* kIndexName = "index.json";

// One optimizer tensor's state: each buffer flat in memory order, and its step count.
struct TensorState {
  std::map<std::string, Tensor> buffers;
  int64_t step = -1;  // -1: the optimizer does not count steps
};

// Splits "exp_avg.3" into ("exp_avg", 3).
std::pair<std::string, size_t> split_key(const std::string& key) {
  const size_t dot = key.rfind('.');
  DPAR_CHECK(dot != std::string::npos && dot + 1 < key.size(), "optimizer state entry '", key,
             "' does not end in a tensor index");
  return {key.substr(0, dot), std::stoul(key.substr(dot + 1))};
}

// A dense tensor of shape/strides holding `logical`'s values, seen as its flat memory.
Tensor to_memory_order(const Tensor& logical, const Shape& shape, const Shape& strides) {
  Tensor dense = Tensor::from_storage(std::make_shared<Storage>(logical.nbytes(), Device::cpu()), 0,
                                      shape, strides, DType::f32);
  dense.copy_(logical);
  return Tensor::from_storage(dense.storage(), 0, {logical.numel()}, {1}, DType::f32);
}

Tensor from_memory_order(const Tensor& flat, const Shape& shape, const Shape& strides) {
  return Tensor::from_storage(flat.storage(), flat.storage_offset(), shape, strides, DType::f32)
      .contiguous();
}

// The optimizer's state per tensor index, in memory order.
std::map<size_t, TensorState> state_by_tensor(const optim::StateDict& state,
                                              const OptimizerLayout& layout) {
  NoGradGuard no_grad;
  std::map<size_t, TensorState> out;
  for (const auto& [key, t] : state) {
    const auto [buffer, i] = split_key(key);
    DPAR_CHECK(i < layout.tensors.size(), "optimizer state entry '", key, "' names tensor ", i,
               " of ", layout.tensors.size());
    if (buffer == "step") {
      out[i].step = static_cast<int64_t>(t.item());
      continue;
    }
    out[i].buffers[buffer] = to_memory_order(t.to(Device::cpu()).to(DType::f32),
                                             layout.tensor_shapes[i], layout.tensor_strides[i]);
  }
  return out;
}

// A stored piece: elements [begin, end) of a parameter, per buffer readable on demand.
struct StoredPiece {
  int64_t begin = 0, end = 0, step = -1;
  std::function<Tensor(const std::string& buffer)> read;
};

// What a state is re-cut from: its buffers, whether it counts steps, and per parameter name
// its layout and pieces.
struct Source {
  std::string what;  // for errors: the directory, or "the unsharded optimizer state"
  std::vector<std::string> buffers;
  bool counts_steps = false;
  std::map<std::string, ParameterLayout> parameters;
  std::map<std::string, std::vector<StoredPiece>> pieces;
};

optim::StateDict assemble(const Source& source, const OptimizerLayout& layout) {
  NoGradGuard no_grad;
  optim::StateDict out;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    int64_t numel = 0;
    for (const SlicePiece& p : layout.tensors[i]) numel += p.end - p.begin;
    std::map<std::string, Tensor> flat;
    for (const std::string& b : source.buffers) flat[b] = Tensor::zeros({numel});
    int64_t covered = 0;
    std::optional<int64_t> step;
    for (const SlicePiece& want : layout.tensors[i]) {
      const ParameterLayout& param = layout.parameters[want.parameter];
      const auto known = source.parameters.find(param.name);
      DPAR_CHECK(known != source.parameters.end(), source.what, " holds no state for parameter '",
                 param.name, "' (another model?)");
      DPAR_CHECK(known->second.shape == param.shape, source.what, ": parameter '", param.name,
                 "' has shape ", known->second.shape, " there and ", param.shape, " here");
      DPAR_CHECK(known->second.strides == param.strides, source.what, ": parameter '", param.name,
                 "' was saved laid out with strides ", known->second.strides, " and has strides ",
                 param.strides,
                 " here (a channels-last GPU layout loaded on the CPU?); load it on the kind of "
                 "device it was saved on");
      const auto stored = source.pieces.find(param.name);
      if (stored == source.pieces.end()) continue;
      for (const StoredPiece& s : stored->second) {
        const int64_t lo = std::max(s.begin, want.begin), hi = std::min(s.end, want.end);
        if (lo >= hi) continue;
        covered += hi - lo;
        DPAR_CHECK(!step || *step == s.step, source.what, ": the elements of optimizer tensor ", i,
                   " come from pieces with different step counts (", *step, " and ", s.step,
                   "); they cannot be one slice");
        step = s.step;
        for (const std::string& b : source.buffers) {
          const Tensor piece = s.read(b);
          flat[b]
              .slice(0, want.offset + lo - want.begin, want.offset + hi - want.begin)
              .copy_(piece.slice(0, lo - s.begin, hi - s.begin));
        }
      }
    }
    if (covered == 0) continue;  // no state: the optimizer had not stepped this tensor
    DPAR_CHECK(covered == numel, source.what, ": optimizer tensor ", i, " has ", numel,
               " elements, of which the stored pieces cover ", covered,
               " (a piece is missing or listed twice)");
    for (const std::string& b : source.buffers) {
      out.emplace_back(
          b + "." + std::to_string(i),
          from_memory_order(flat[b], layout.tensor_shapes[i], layout.tensor_strides[i]));
    }
    if (source.counts_steps) {
      out.emplace_back("step." + std::to_string(i),
                       Tensor::from_vector(std::vector<int64_t>{*step}, {}));
    }
  }
  return out;
}

Json layout_json(const ParameterLayout& p) {
  return {{"name", p.name}, {"shape", p.shape}, {"strides", p.strides}};
}

[[noreturn]] void bad_index(const std::string& path, const std::string& problem) {
  DPAR_FAIL("optimizer shards: ", path, ": ", problem);
}

}  // namespace

OptimizerLayout whole_parameter_layout(const std::vector<std::pair<std::string, Tensor>>& params) {
  OptimizerLayout layout;
  for (const auto& [name, t] : params) {
    const Shape strides = t.is_dense() ? t.strides() : contiguous_strides(t.shape());
    layout.tensors.push_back({{layout.parameters.size(), 0, t.numel(), 0}});
    layout.tensor_shapes.push_back(t.shape());
    layout.tensor_strides.push_back(strides);
    layout.parameters.push_back({name, t.shape(), strides});
  }
  return layout;
}

void save_optimizer_shards(const std::string& dir, const OptimizerLayout& layout,
                           const optim::Optimizer& opt, Group* group) {
  save_optimizer_shards(dir, layout, opt.state_dict(), opt.name(), group);
}

void save_optimizer_shards(const std::string& dir, const OptimizerLayout& layout,
                           const optim::StateDict& state, const std::string& optimizer_name,
                           Group* group) {
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const std::string tmp = dir + ".tmp";
  const std::string file =
      "rank-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
  if (rank == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  if (group) group->barrier();

  Json mine = Json::object();
  try {
    std::vector<std::string> buffers;
    for (const auto& [key, t] : state) {
      const std::string b = split_key(key).first;
      if (b != "step" && std::find(buffers.begin(), buffers.end(), b) == buffers.end()) {
        buffers.push_back(b);
      }
    }
    Json pieces = Json::array(), params = Json::array();
    io::NamedTensors tensors;
    for (const auto& [i, st] : state_by_tensor(state, layout)) {
      for (size_t k = 0; k < layout.tensors[i].size(); ++k) {
        const SlicePiece& p = layout.tensors[i][k];
        Json entry = {{"parameter", layout.parameters[p.parameter].name},
                      {"begin", p.begin},
                      {"end", p.end},
                      {"step", st.step},
                      {"tensors", Json::object()}};
        for (const auto& [b, flat] : st.buffers) {
          Tensor part = flat.slice(0, p.offset, p.offset + p.end - p.begin).contiguous();
          const std::string name = b + "/" + std::to_string(i) + "/" + std::to_string(k);
          entry["tensors"][b] = {
              {"name", name}, {"crc32c", ::dpar::detail::crc32c(part.raw_data(), part.nbytes())}};
          tensors.emplace_back(name, part);
        }
        pieces.push_back(std::move(entry));
      }
    }
    for (const ParameterLayout& p : layout.parameters) params.push_back(layout_json(p));
    io::save_safetensors(tmp + "/" + file, tensors);
    mine = {{"file", file}, {"buffers", buffers}, {"pieces", pieces}, {"parameters", params}};
  } catch (const std::exception& e) {
    mine = {{"error", e.what()}};
  }
  const std::vector<std::string> all =
      group ? allgather_strings(*group, mine.dump()) : std::vector<std::string>{mine.dump()};
  std::vector<Json> parts;
  for (int r = 0; r < world; ++r) {
    parts.push_back(Json::parse(all[static_cast<size_t>(r)]));
    if (parts.back().contains("error")) {
      DPAR_FAIL("save_optimizer_shards: rank ", r, " could not write its shards to ", tmp, ": ",
                parts.back()["error"].get<std::string>(), "; the previous sets are untouched");
    }
  }
  std::string failure;
  if (rank == 0) {
    try {
      Json index = {{"format", kFormat},
                    {"version", kVersion},
                    {"optimizer", optimizer_name},
                    {"world_size", world},
                    {"buffers", Json::array()},
                    {"counts_steps", false},
                    {"parameters", Json::object()},
                    {"files", Json::array()},
                    {"pieces", Json::array()}};
      for (int r = 0; r < world; ++r) {
        const Json& part = parts[static_cast<size_t>(r)];
        index["files"].push_back(part["file"]);
        for (const auto& b : part["buffers"]) {
          auto& list = index["buffers"];
          if (std::find(list.begin(), list.end(), b) == list.end()) list.push_back(b);
        }
        for (const auto& p : part["parameters"])
          index["parameters"][p["name"].get<std::string>()] = p;
        for (Json piece : part["pieces"]) {
          if (piece["step"].get<int64_t>() >= 0) index["counts_steps"] = true;
          piece["file"] = r;
          index["pieces"].push_back(std::move(piece));
        }
      }
      {
        const std::string path = tmp + "/" + kIndexName;
        std::ofstream out(path);
        out << index.dump(1) << "\n";
        out.close();
        DPAR_CHECK(out.good(), "cannot write ", path);
      }
      io::detail::sync_directory(tmp);
      fs::remove_all(dir);  // a set of the same name (the same step, saved again)
      fs::rename(tmp, dir);
      io::detail::sync_directory(fs::path(dir).parent_path().empty()
                                     ? std::string(".")
                                     : fs::path(dir).parent_path().string());
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  // Every rank learns whether the set is complete.
  Tensor ok = Tensor::full({1}, failure.empty() ? 1.0 : 0.0);
  if (group) group->broadcast({ok}, 0, /*async_op=*/false);
  DPAR_CHECK(ok.item() == 1.0, "save_optimizer_shards: rank 0 could not complete ", dir,
             failure.empty() ? std::string() : ": " + failure);
}

optim::StateDict read_optimizer_shards(const std::string& dir, const OptimizerLayout& layout,
                                       const std::string& optimizer_name) {
  const std::string index_path = dir + "/" + kIndexName;
  std::ifstream in(index_path);
  if (!in.is_open()) {
    bad_index(index_path, fs::exists(dir + ".tmp")
                              ? "missing: the set was never completed (a rank died while saving)"
                              : "missing (not a shard set, or removed)");
  }
  Json index;
  try {
    index = Json::parse(in);
    DPAR_CHECK(index.value("format", "") == kFormat, "not a shard index (format '",
               index.value("format", ""), "')");
    DPAR_CHECK(index.value("version", 0) == kVersion, "index version ", index.value("version", 0),
               " is not ", kVersion);
  } catch (const std::exception& e) {
    bad_index(index_path, e.what());
  }
  const std::string saved_by = index.value("optimizer", "");
  DPAR_CHECK(saved_by == optimizer_name, "optimizer shards: ", dir, " hold ", saved_by,
             " state; this optimizer is ", optimizer_name);
  Source source;
  source.what = dir;
  try {
    source.buffers = index.at("buffers").get<std::vector<std::string>>();
    source.counts_steps = index.at("counts_steps").get<bool>();
    for (const auto& [name, p] : index.at("parameters").items()) {
      source.parameters[name] = {name, p.at("shape").get<Shape>(), p.at("strides").get<Shape>()};
    }
    const auto files = index.at("files").get<std::vector<std::string>>();
    // Headers are read once per file, and only for the files that hold a needed piece.
    auto headers = std::make_shared<std::map<std::string, io::SafetensorsHeader>>();
    for (const auto& piece : index.at("pieces")) {
      StoredPiece s;
      s.begin = piece.at("begin").get<int64_t>();
      s.end = piece.at("end").get<int64_t>();
      s.step = piece.at("step").get<int64_t>();
      const size_t f = piece.at("file").get<size_t>();
      DPAR_CHECK(f < files.size() && s.begin >= 0 && s.begin <= s.end &&
                     files[f].find('/') == std::string::npos,
                 "piece ", piece.dump(), " is invalid");
      const std::string path = dir + "/" + files[f];
      // What a piece's tensors are called and their CRCs, checked here rather than when read.
      std::map<std::string, std::pair<std::string, uint32_t>> tensors;
      for (const std::string& b : source.buffers) {
        const Json& entry = piece.at("tensors").at(b);
        tensors[b] = {entry.at("name").get<std::string>(), entry.at("crc32c").get<uint32_t>()};
      }
      s.read = [path, tensors, headers, n = s.end - s.begin](const std::string& buffer) {
        auto it = headers->find(path);
        if (it == headers->end()) {
          it = headers->emplace(path, io::read_safetensors_header(path)).first;
        }
        const auto& [name, want_crc] = tensors.at(buffer);
        for (const io::SafetensorsEntry& e : it->second.entries) {
          if (e.name != name) continue;
          DPAR_CHECK(e.dtype == DType::f32 && e.shape == Shape{n}, "optimizer shards: ", path,
                     ": tensor '", name, "' is ", dtype_name(e.dtype), e.shape,
                     ", the index says f32 [", n, "]");
          Tensor t = io::read_safetensors_entry(path, e);
          DPAR_CHECK(::dpar::detail::crc32c(t.raw_data(), t.nbytes()) == want_crc,
                     "optimizer shards: ", path, ": tensor '", name,
                     "' fails its CRC-32C check (corrupted)");
          return t;
        }
        DPAR_FAIL("optimizer shards: ", path, " has no tensor '", name, "'");
      };
      source.pieces[piece.at("parameter").get<std::string>()].push_back(std::move(s));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    bad_index(index_path, e.what());
  }
  return assemble(source, layout);
}

optim::StateDict slice_optimizer_state(const optim::StateDict& whole, const OptimizerLayout& from,
                                       const OptimizerLayout& layout) {
  Source source;
  source.what = "the unsharded optimizer state";
  for (const ParameterLayout& p : from.parameters) source.parameters[p.name] = p;
  for (const auto& [i, st] : state_by_tensor(whole, from)) {
    if (st.step >= 0) source.counts_steps = true;
    for (const SlicePiece& p : from.tensors[i]) {
      StoredPiece s{p.begin, p.end, st.step, {}};
      std::map<std::string, Tensor> parts;
      for (const auto& [b, flat] : st.buffers) {
        parts[b] = flat.slice(0, p.offset, p.offset + p.end - p.begin);
        if (std::find(source.buffers.begin(), source.buffers.end(), b) == source.buffers.end()) {
          source.buffers.push_back(b);
        }
      }
      s.read = [parts](const std::string& b) { return parts.at(b); };
      source.pieces[from.parameters[p.parameter].name].push_back(std::move(s));
    }
  }
  return assemble(source, layout);
}

}  // namespace dpar::dist
