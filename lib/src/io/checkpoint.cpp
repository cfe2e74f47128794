// Checkpoint files: capture/restore of a training run and the verified file format. The
// directory layout (rotation, latest/best) and the cross-rank load are in
// checkpoint_manager.cpp.
#include "dpar/io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/random.h"
#include "dpar/core/version.h"
#include "dpar/io/safetensors.h"
#include "dpar/nn/weights.h"
#include "io/checkpoint_format.h"

namespace dpar::io {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kFormatKey = "format";
constexpr const char* kFormatValue = "dpar.checkpoint";
constexpr const char* kVersionKey = "format_version";
constexpr const char* kVersionValue = "1";
constexpr const char* kStateKey = "dpar.checkpoint";
constexpr const char* kChecksumKey = "dpar.checksum";
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as load_safetensors

const char* const kSections[] = {"model.", "optimizer.", "scheduler."};

// CRC-32 over everything a checkpoint means: each tensor's name, dtype, shape and bytes in
// file order, then the state JSON. Truncation is caught earlier by the safetensors layout
// checks; this catches flipped bits in data and edited values.
class Checksum {
 public:
  void feed(const void* data, size_t n) {
    crc_ = crc32_z(crc_, static_cast<const Bytef*>(data), n);
  }
  void feed(const std::string& s) { feed(s.data(), s.size() + 1); }  // with the NUL separator
  void feed(const std::string& name, const Tensor& contiguous) {
    feed(name);
    const std::string_view dt = dtype_name(contiguous.dtype());
    feed(dt.data(), dt.size());
    for (const int64_t d : contiguous.shape()) feed(&d, sizeof(d));
    if (contiguous.numel() > 0) feed(contiguous.raw_data(), contiguous.nbytes());
  }
  std::string hex() const {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%08lx", static_cast<unsigned long>(crc_));
    return std::string("crc32:") + buf;
  }

 private:
  uLong crc_ = crc32_z(0, Z_NULL, 0);
};

}  // namespace

void detail::sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DPAR_CHECK(fd >= 0, "save_checkpoint: cannot open directory ", dir,
             " to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot sync directories (EINVAL); the rename is then as durable as the
  // file system makes it.
  DPAR_CHECK(rc == 0 || err == EINVAL, "save_checkpoint: fsync of directory ", dir,
             " failed: ", std::strerror(err));
}

namespace {

std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// The __metadata__ object of a safetensors file, reading only the header.
Metadata read_header_metadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPAR_CHECK(in.is_open(), "checkpoint ", path, ": cannot open: ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(std::max<std::streamoff>(0, in.tellg()));
  in.seekg(0, std::ios::beg);
  uint64_t header_len = 0;
  DPAR_CHECK(size >= 8 && in.read(reinterpret_cast<char*>(&header_len), 8), "checkpoint ", path,
             ": truncated (", size, " bytes)");
  DPAR_CHECK(header_len <= size - 8 && header_len <= kMaxHeaderBytes, "checkpoint ", path,
             ": header length ", header_len, " does not fit the ", size, "-byte file (truncated?)");
  std::string text(header_len, '\0');
  DPAR_CHECK(in.read(text.data(), static_cast<std::streamsize>(header_len)), "checkpoint ", path,
             ": cannot read the header");
  Json header;
  try {
    header = Json::parse(text);
  } catch (const Json::exception& e) {
    DPAR_FAIL("checkpoint ", path, ": invalid JSON header: ", e.what());
  }
  Metadata meta;
  if (header.is_object() && header.contains("__metadata__") && header["__metadata__"].is_object()) {
    for (const auto& [k, v] : header["__metadata__"].items()) {
      if (v.is_string()) meta[k] = v.get<std::string>();
    }
  }
  return meta;
}

void check_format(const Metadata& meta, const std::string& path) {
  const auto format = meta.find(kFormatKey);
  DPAR_CHECK(format != meta.end() && format->second == kFormatValue && meta.count(kStateKey),
             "checkpoint ", path,
             " is not a dpar checkpoint (no checkpoint metadata; a plain weights file loads "
             "with nn::load_weights / --pretrained)");
  const auto version = meta.find(kVersionKey);
  DPAR_CHECK(version != meta.end() && version->second == kVersionValue, "checkpoint ", path,
             ": format version ", version == meta.end() ? std::string("(none)") : version->second,
             " is not supported (this dpar reads version ", kVersionValue, ")");
}

std::string join_names(const std::vector<std::string>& names, size_t listed) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < listed; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > listed) out += ", ... " + std::to_string(names.size() - listed) + " more";
  return out;
}

std::string shape_text(const Shape& s) { return ::dpar::detail::str_cat(s); }

}  // namespace

namespace detail {

std::string state_to_json(const TrainingState& s) {
  Json j = {{"model", s.model_name},
            {"epoch", s.epoch},
            {"step_in_epoch", s.step_in_epoch},
            {"global_step", s.global_step},
            {"sampler_position", s.sampler_position},
            {"steps_per_epoch", s.steps_per_epoch},
            {"batch_size", s.batch_size},
            {"world_size", s.world_size},
            {"seed", s.seed},
            {"best_top1", s.best_top1},
            {"best_epoch", s.best_epoch},
            {"rng", s.rng},
            {"extra", s.extra},
            {"dpar_version", s.dpar_version},
            {"git_commit", s.git_commit}};
  return j.dump();
}

namespace {

// An integer field: a JSON float (1e76) or an unsigned value beyond int64 is an error, not a
// conversion (nlohmann converts floats with a cast, undefined behaviour out of range).
int64_t integer_field(const Json& j, const char* key, const std::string& source) {
  const Json& v = j.at(key);
  const bool fits =
      v.is_number_integer() &&
      (!v.is_number_unsigned() ||
       v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  DPAR_CHECK(fits, "checkpoint ", source, ": training state: ", key, " is ", v.dump(),
             ", not a 64-bit integer");
  return v.get<int64_t>();
}

}  // namespace

TrainingState state_from_json(const std::string& text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    DPAR_FAIL("checkpoint ", source, ": invalid training-state JSON: ", e.what());
  }
  DPAR_CHECK(j.is_object(), "checkpoint ", source, ": training state is not a JSON object");
  TrainingState s;
  try {
    s.model_name = j.at("model").get<std::string>();
    s.epoch = integer_field(j, "epoch", source);
    s.step_in_epoch = integer_field(j, "step_in_epoch", source);
    s.global_step = integer_field(j, "global_step", source);
    s.sampler_position = integer_field(j, "sampler_position", source);
    s.steps_per_epoch = integer_field(j, "steps_per_epoch", source);
    s.batch_size = integer_field(j, "batch_size", source);
    s.world_size = integer_field(j, "world_size", source);
    DPAR_CHECK(j.at("seed").is_number_unsigned() ||
                   (j.at("seed").is_number_integer() && j.at("seed").get<int64_t>() >= 0),
               "checkpoint ", source, ": training state: seed is ", j.at("seed").dump(),
               ", not an unsigned 64-bit integer");
    s.seed = j.at("seed").get<uint64_t>();
    s.best_top1 = j.at("best_top1").get<double>();
    s.best_epoch = integer_field(j, "best_epoch", source);
    s.rng = j.at("rng").get<std::map<std::string, std::string>>();
    s.extra = j.at("extra").get<std::map<std::string, std::string>>();
    s.dpar_version = j.at("dpar_version").get<std::string>();
    s.git_commit = j.at("git_commit").get<std::string>();
  } catch (const Json::exception& e) {
    DPAR_FAIL("checkpoint ", source, ": training state: ", e.what());
  }
  DPAR_CHECK(s.epoch >= 0 && s.step_in_epoch >= 0 && s.global_step >= 0, "checkpoint ", source,
             ": negative position (epoch ", s.epoch, ", step ", s.step_in_epoch, ", global step ",
             s.global_step, ")");
  return s;
}

DType parse_dtype_name(const std::string& name, const std::string& source) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i64, DType::u8}) {
    if (name == dtype_name(t)) return t;
  }
  DPAR_FAIL("checkpoint ", source, ": unknown dtype '", name, "'");
}

}  // namespace detail

std::string describe_mismatch(const nn::LoadReport& report, size_t listed) {
  std::vector<std::string> parts;
  if (!report.missing.empty()) {
    parts.push_back(std::to_string(report.missing.size()) + " missing from the checkpoint (" +
                    join_names(report.missing, listed) + ")");
  }
  if (!report.unexpected.empty()) {
    parts.push_back(std::to_string(report.unexpected.size()) + " unexpected (" +
                    join_names(report.unexpected, listed) + ")");
  }
  if (!report.mismatched.empty()) {
    std::vector<std::string> shapes;
    for (const auto& m : report.mismatched) {
      shapes.push_back(m.name + ": model " + shape_text(m.expected) + " vs checkpoint " +
                       shape_text(m.got));
    }
    parts.push_back(std::to_string(report.mismatched.size()) + " mis-shaped (" +
                    join_names(shapes, listed) + ")");
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out;
}

Checkpoint capture_checkpoint(const nn::Module& model, const optim::Optimizer* optimizer,
                              const optim::LRScheduler* scheduler, TrainingState state) {
  Checkpoint c;
  c.model = model.state_dict();
  if (optimizer) {
    c.optimizer = optimizer->state_dict();
    state.extra["optimizer"] = optimizer->name();
  }
  if (scheduler) c.scheduler = scheduler->state_dict();
  state.rng["default"] = default_generator().state();
  state.dpar_version = version();
  state.git_commit = git_commit();
  c.state = std::move(state);
  return c;
}

void restore_checkpoint(const Checkpoint& ckpt, nn::Module& model, optim::Optimizer* optimizer,
                        optim::LRScheduler* scheduler, const std::string& source) {
  // Validate everything that can be validated without side effects first.
  const nn::LoadReport report = model.compare_state_dict(ckpt.model);
  DPAR_CHECK(report.ok(), "checkpoint ", source, " holds a ",
             ckpt.state.model_name.empty() ? std::string("different") : ckpt.state.model_name,
             " model that does not fit this ", model.type_name(),
             " (nothing was loaded): ", describe_mismatch(report));
  if (optimizer) {
    const auto kind = ckpt.state.extra.find("optimizer");
    DPAR_CHECK(kind == ckpt.state.extra.end() || kind->second == optimizer->name(), "checkpoint ",
               source, " holds ", kind->second, " optimizer state, but this run uses ",
               optimizer->name());
  }
  if (scheduler) {
    DPAR_CHECK(ckpt.scheduler.size() == 1 && ckpt.scheduler[0].first == "last_step", "checkpoint ",
               source, " has no LR scheduler state ('scheduler.last_step')");
  }
  Generator rng_check;
  const auto rng = ckpt.state.rng.find("default");
  if (rng != ckpt.state.rng.end()) {
    try {
      rng_check.set_state(rng->second);
    } catch (const Error& e) {
      DPAR_FAIL("checkpoint ", source, ": default generator state: ", e.what());
    }
  }
  // The optimizer checks its state completely and changes nothing when it throws; after it,
  // nothing below can fail.
  if (optimizer) {
    try {
      optimizer->load_state_dict(ckpt.optimizer);
    } catch (const Error& e) {
      DPAR_FAIL("checkpoint ", source,
                ": optimizer state does not fit (nothing was loaded): ", e.what());
    }
  }
  model.load_state_dict(ckpt.model, /*strict=*/true);
  if (scheduler) scheduler->load_state_dict(ckpt.scheduler);
  if (rng != ckpt.state.rng.end()) default_generator() = rng_check;
}

void save_checkpoint(const std::string& path, const Checkpoint& ckpt,
                     const ProgressCallback& progress) {
  NoGradGuard no_grad;
  NamedTensors tensors;
  Checksum crc;
  const nn::NamedTensors* groups[] = {&ckpt.model, &ckpt.optimizer, &ckpt.scheduler};
  for (size_t g = 0; g < 3; ++g) {
    for (const auto& [name, t] : *groups[g]) {
      DPAR_CHECK(t.defined(), "save_checkpoint: ", path, ": tensor '", name, "' is undefined");
      // The checksum must cover the bytes exactly as written: contiguous host copies.
      Tensor host = t.detach().to(Device::cpu()).contiguous();
      std::string full = std::string(kSections[g]) + name;
      crc.feed(full, host);
      tensors.emplace_back(std::move(full), std::move(host));
    }
  }
  const std::string state = detail::state_to_json(ckpt.state);
  crc.feed(state);
  const Metadata meta{{kFormatKey, kFormatValue},
                      {kVersionKey, kVersionValue},
                      {kStateKey, state},
                      {kChecksumKey, crc.hex()}};
  save_safetensors(path, tensors, meta, progress);  // tmp + fsync + rename
  detail::sync_directory(parent_dir(path));         // makes the rename itself durable
}

Checkpoint load_checkpoint(const std::string& path) {
  DPAR_CHECK(std::filesystem::exists(path), "checkpoint ", path, ": no such file");
  DPAR_CHECK(!std::filesystem::is_directory(path), "checkpoint ", path, " is a directory");
  SafetensorsContents contents = load_safetensors(path);
  check_format(contents.metadata, path);
  const auto stored = contents.metadata.find(kChecksumKey);
  DPAR_CHECK(stored != contents.metadata.end(), "checkpoint ", path, ": no checksum");
  const std::string& state_text = contents.metadata.at(kStateKey);
  Checksum crc;
  for (const auto& [name, t] : contents.tensors) crc.feed(name, t);
  crc.feed(state_text);
  DPAR_CHECK(crc.hex() == stored->second, "checkpoint ", path, " is corrupt: checksum ", crc.hex(),
             " does not match the stored ", stored->second);

  Checkpoint ckpt;
  ckpt.state = detail::state_from_json(state_text, path);
  nn::NamedTensors* groups[] = {&ckpt.model, &ckpt.optimizer, &ckpt.scheduler};
  for (auto& [name, t] : contents.tensors) {
    bool placed = false;
    for (size_t g = 0; g < 3 && !placed; ++g) {
      const std::string prefix = kSections[g];
      if (name.compare(0, prefix.size(), prefix) == 0) {
        groups[g]->emplace_back(name.substr(prefix.size()), std::move(t));
        placed = true;
      }
    }
    DPAR_CHECK(placed, "checkpoint ", path, ": tensor '", name,
               "' belongs to no section (model., optimizer., scheduler.)");
  }
  return ckpt;
}

TrainingState read_checkpoint_state(const std::string& path) {
  const Metadata meta = read_header_metadata(path);
  check_format(meta, path);
  return detail::state_from_json(meta.at(kStateKey), path);
}

bool is_checkpoint_file(const std::string& path) {
  try {
    const Metadata meta = read_header_metadata(path);
    const auto format = meta.find(kFormatKey);
    return format != meta.end() && format->second == kFormatValue;
  } catch (const Error&) {
    return false;
  }
}

nn::LoadReport load_model_weights(nn::Module& model, const std::string& path, bool strict) {
  if (!is_checkpoint_file(path)) return nn::load_weights(model, path, strict);
  const Checkpoint ckpt = load_checkpoint(path);
  const nn::LoadReport check = model.compare_state_dict(ckpt.model);
  DPAR_CHECK(!strict || check.ok(), "checkpoint ", path, " holds a ",
             ckpt.state.model_name.empty() ? std::string("different") : ckpt.state.model_name,
             " model that does not fit this ", model.type_name(),
             " (nothing was loaded): ", describe_mismatch(check));
  return model.load_state_dict(ckpt.model, /*strict=*/false);
}

}  // namespace dpar::io
