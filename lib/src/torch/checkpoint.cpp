#include "dpar/torch/checkpoint.h"

#include <torch/serialize/archive.h>
#include <torch/version.h>

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "dpar/distributed/parallel_env.h"
#include "dpar/torch/tensor.h"

namespace dpar::torch {
namespace {

constexpr const char* kOptimizerArchive = "torch_archive";
constexpr const char* kTorchRng = "torch_cpu";

Tensor bytes_tensor(const std::string& bytes) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::u8);
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.numel()));
}

std::string hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string unhex(const std::string& text) {
  auto value = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    DPAR_FAIL("dpar::torch checkpoint: the libtorch generator state is not hexadecimal");
  };
  DPAR_CHECK(text.size() % 2 == 0,
             "dpar::torch checkpoint: the libtorch generator state has an odd length");
  std::string out;
  for (size_t i = 0; i < text.size(); i += 2) {
    out += static_cast<char>(value(text[i]) * 16 + value(text[i + 1]));
  }
  return out;
}

at::Tensor cpu_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

}  // namespace

io::Checkpoint capture_checkpoint(const ::torch::nn::Module& module,
                                  ::torch::optim::Optimizer* optimizer, io::TrainingState state) {
  io::Checkpoint ck;
  for (const auto& item : module.named_parameters()) {
    ck.model.emplace_back(item.key(), to_dpar(item.value().detach()));
  }
  for (const auto& item : module.named_buffers()) {
    ck.model.emplace_back(item.key(), to_dpar(item.value()));
  }
  if (optimizer) {
    ::torch::serialize::OutputArchive archive;
    optimizer->save(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    ck.optimizer.emplace_back(kOptimizerArchive, bytes_tensor(bytes.str()));
  }
  const at::Tensor rng = cpu_generator_state().contiguous();
  state.rng[kTorchRng] =
      hex(std::string(static_cast<const char*>(rng.data_ptr()), static_cast<size_t>(rng.numel())));
  state.extra["framework"] = "libtorch " TORCH_VERSION;
  ck.state = std::move(state);
  return ck;
}

io::TrainingState restore_checkpoint(const io::Checkpoint& checkpoint, ::torch::nn::Module& module,
                                     ::torch::optim::Optimizer* optimizer) {
  // Everything is checked before anything is written, so a mismatch loads nothing.
  std::map<std::string, const Tensor*> saved;
  for (const auto& [name, t] : checkpoint.model) saved[name] = &t;
  std::vector<std::pair<at::Tensor, const Tensor*>> targets;
  std::string problems;
  size_t count = 0;
  auto match = [&](const std::string& name, const at::Tensor& live) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      problems += (count++ ? "; " : "") + name + " is missing from the checkpoint";
      return;
    }
    const Tensor& t = *it->second;
    if (t.shape() != Shape(live.sizes().begin(), live.sizes().end()) ||
        scalar_type_of(t.dtype()) != live.scalar_type()) {
      problems += (count++ ? "; " : "") + name + " is " + c10::toString(scalar_type_of(t.dtype())) +
                  shape_str(t.shape()) + " in the checkpoint, " +
                  c10::toString(live.scalar_type()) + shape_str(live.sizes().vec()) +
                  " in the module";
      saved.erase(it);
      return;
    }
    targets.emplace_back(live, it->second);
    saved.erase(it);
  };
  for (const auto& item : module.named_parameters()) match(item.key(), item.value());
  for (const auto& item : module.named_buffers()) match(item.key(), item.value());
  for (const auto& [name, t] : saved) {
    problems += (count++ ? "; " : "") + name + " is in the checkpoint but not in the module";
  }
  DPAR_CHECK(problems.empty(), "dpar::torch::restore_checkpoint: the checkpoint does not fit the ",
             "module (nothing loaded): ", problems);
  {
    at::NoGradGuard no_grad;
    for (auto& [live, t] : targets) live.copy_(to_torch(*t));
  }
  if (optimizer) {
    for (const auto& [name, t] : checkpoint.optimizer) {
      if (name != kOptimizerArchive) continue;
      const std::string bytes = bytes_of(t);
      ::torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      optimizer->load(archive);
    }
  }
  auto rng = checkpoint.state.rng.find(kTorchRng);
  if (rng != checkpoint.state.rng.end()) {
    const std::string bytes = unhex(rng->second);
    at::Tensor state = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
  return checkpoint.state;
}

void save_checkpoint(const std::string& path, const ::torch::nn::Module& module,
                     ::torch::optim::Optimizer* optimizer, io::TrainingState state) {
  if (dist::get_rank() != 0) return;
  state.world_size = dist::get_world_size();
  io::save_checkpoint(path, capture_checkpoint(module, optimizer, std::move(state)));
}

io::TrainingState load_checkpoint(const std::string& path, ::torch::nn::Module& module,
                                  ::torch::optim::Optimizer* optimizer) {
  std::optional<io::Checkpoint> ck = io::load_on_rank0_and_broadcast(
      [&]() -> std::optional<io::Checkpoint> { return io::load_checkpoint(path); });
  return restore_checkpoint(*ck, module, optimizer);
}

}  // namespace dpar::torch
