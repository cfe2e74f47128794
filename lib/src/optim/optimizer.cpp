// Optimizer base: parameter checks, zero_grad, the shared per-parameter state, and saving /
// restoring that state with strict validation.
#include "dpar/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "dpar/autograd/engine.h"
#include "dpar/autograd/grad_mode.h"

namespace dpar::optim {
namespace {

// DPAR_OPTIM_MULTI_TENSOR: 0 forces the per-parameter kernels (to compare or bisect), 1 or
// unset uses the multi-tensor ones where the device has them.
bool multi_tensor_from_env() {
  const char* text = std::getenv("DPAR_OPTIM_MULTI_TENSOR");
  if (text == nullptr || *text == '\0') return true;
  const std::string value = text;
  DPAR_CHECK(value == "0" || value == "1", "DPAR_OPTIM_MULTI_TENSOR: expected 0 or 1, got '", value,
             "'");
  return value == "1";
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  check_parameters();
  state_.resize(params_.size());
  multi_tensor_ = multi_tensor_from_env();
}

void Optimizer::check_parameters() const {
  DPAR_CHECK(!params_.empty(), "Optimizer: got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    DPAR_CHECK(p.defined(), "Optimizer: parameter ", i, " is undefined");
    DPAR_CHECK(p.dtype() == DType::f32, "Optimizer: parameter ", i, " has dtype ", p.dtype(),
               ", only f32 parameters are supported");
    DPAR_CHECK(p.is_leaf(), "Optimizer: parameter ", i, " (shape ", p.shape(),
               ") is not a leaf tensor; optimize the tensors the model owns, not results of ops");
    for (size_t j = 0; j < i; ++j) {
      DPAR_CHECK(!params_[j].is_same(p), "Optimizer: parameter ", i,
                 " is the same tensor as parameter ", j, "; each parameter may appear once");
    }
  }
}

void Optimizer::step() {
  update();
  run_step_hooks();
}

void Optimizer::run_step_hooks() {
  for (const auto& [handle, hook] : step_hooks_) hook();
}

int Optimizer::add_step_hook(std::function<void()> hook) {
  step_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

void Optimizer::remove_step_hook(int handle) {
  std::erase_if(step_hooks_, [&](const auto& entry) { return entry.first == handle; });
}

bool Optimizer::has_state() const {
  return std::any_of(state_.begin(), state_.end(),
                     [](const ParamState& st) { return st.initialized; });
}

size_t Optimizer::state_bytes() const {
  size_t bytes = 0;
  for (const ParamState& st : state_) {
    for (const auto& [name, t] : st.buffers) bytes += t.nbytes();
  }
  return bytes;
}

void Optimizer::replace_parameters(std::vector<Tensor> params) {
  DPAR_CHECK(!has_state(), name(),
             "::replace_parameters: the optimizer already has state for its parameters");
  std::swap(params_, params);
  try {
    check_parameters();
  } catch (...) {
    std::swap(params_, params);
    throw;
  }
  state_.assign(params_.size(), ParamState{});
}

void Optimizer::check_lr(double lr) const {
  DPAR_CHECK(std::isfinite(lr) && lr >= 0, name(), ": learning rate must be >= 0, got ", lr);
}

void Optimizer::set_lr(double lr) {
  check_lr(lr);
  lr_ = lr;
}

void Optimizer::zero_grad(bool set_to_none) { autograd::zero_grad(params_, set_to_none); }

bool Optimizer::prepare(size_t i, Operands& ops, bool zero_init) {
  const Tensor& p = params_[i];
  Tensor g = p.grad();
  if (!g.defined()) return false;
  DPAR_CHECK(g.shape() == p.shape(), name(), ": gradient of parameter ", i, " has shape ",
             g.shape(), ", the parameter has shape ", p.shape());
  DPAR_CHECK(g.device() == p.device(), name(), ": gradient of parameter ", i, " is on ", g.device(),
             ", the parameter on ", p.device());
  ops.index = i;
  // Kernels run over flat memory: a non-dense parameter is updated through a dense copy, and
  // a gradient in another layout (or dtype) is brought to the parameter's.
  ops.param = p.is_dense() ? p : p.contiguous();
  if (g.dtype() != DType::f32 || g.strides() != ops.param.strides() || !g.is_dense()) {
    Tensor staged = Tensor::empty_like(ops.param);
    staged.copy_(g);
    g = staged;
  }
  ops.grad = g;
  ParamState& st = state_[i];
  if (!st.initialized) {
    for (const std::string& buf : buffer_names()) {
      Tensor t = Tensor::empty_like(ops.param);
      if (zero_init) t.zero_();
      st.buffers[buf] = t;
    }
  } else {
    // A buffer restored from a state dict may be contiguous while the parameter is not.
    for (auto& [buf, t] : st.buffers) {
      if (t.strides() != ops.param.strides()) {
        Tensor re = Tensor::empty_like(ops.param);
        re.copy_(t);
        t = re;
      }
    }
  }
  ops.state = &st;
  return true;
}

void Optimizer::finish(const Operands& ops) {
  ops.state->initialized = true;
  if (counts_steps()) ++ops.state->step;
  Tensor& p = params_[ops.index];
  if (!ops.param.is_same(p)) p.copy_(ops.param);
}

std::vector<std::pair<Device, std::vector<size_t>>> Optimizer::params_by_device() const {
  std::vector<std::pair<Device, std::vector<size_t>>> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Device device = params_[i].device();
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == device; });
    if (it == groups.end()) it = groups.insert(groups.end(), {device, {}});
    it->second.push_back(i);
  }
  return groups;
}

std::pair<std::string, size_t> split_state_key(const std::string& key, size_t num_params,
                                               const std::string& who) {
  const size_t dot = key.rfind('.');
  const std::string buf = dot == std::string::npos ? key : key.substr(0, dot);
  const std::string idx = dot == std::string::npos ? "" : key.substr(dot + 1);
  DPAR_CHECK(!idx.empty() && idx.size() < 10 &&
                 std::all_of(idx.begin(), idx.end(), [](char c) { return c >= '0' && c <= '9'; }),
             who, ": entry '", key, "' does not end in a parameter index");
  const size_t i = std::stoul(idx);
  DPAR_CHECK(i < num_params, who, ": entry '", key, "' refers to parameter ", i,
             " but the optimizer has ", num_params);
  return {buf, i};
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < state_.size(); ++i) {
    const ParamState& st = state_[i];
    if (!st.initialized) continue;
    // (Built by appending: GCC 12 misreports "." + std::to_string(i) under -Wrestrict.)
    std::string suffix(1, '.');
    suffix += std::to_string(i);
    if (counts_steps()) {
      out.emplace_back("step" + suffix, Tensor::from_vector(std::vector<int64_t>{st.step}, {}));
    }
    for (const auto& [buf, t] : st.buffers) out.emplace_back(buf + suffix, t.contiguous());
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  const std::vector<std::string> names = buffer_names();
  std::string expected;
  for (const std::string& n : names) expected += (expected.empty() ? "" : ", ") + n + ".<i>";
  if (counts_steps()) expected += (expected.empty() ? "" : ", ") + std::string("step.<i>");
  if (expected.empty()) expected = "no state";

  // Validate everything before touching the live state.
  std::vector<std::map<std::string, Tensor>> incoming(params_.size());
  std::vector<int64_t> steps(params_.size(), -1);
  for (const auto& [key, t] : state) {
    const std::string who = detail::str_cat(name(), "::load_state_dict");
    const std::string buf = key.substr(0, key.rfind('.'));  // the whole key without a dot
    const bool known = std::find(names.begin(), names.end(), buf) != names.end() ||
                       (buf == "step" && counts_steps());
    DPAR_CHECK(known, who, ": unexpected entry '", key, "'; this ", name(), " keeps ", expected,
               " (is this another optimizer's state, or one saved with "
               "other options?)");
    const size_t i = split_state_key(key, params_.size(), who).second;
    DPAR_CHECK(t.defined(), name(), "::load_state_dict: entry '", key, "' is undefined");
    if (buf == "step") {
      DPAR_CHECK(t.numel() == 1 && steps[i] < 0, name(), "::load_state_dict: entry '", key,
                 "' must be a single step count given once, got shape ", t.shape());
      const double v = t.item();
      DPAR_CHECK(v >= 0 && v == std::floor(v), name(), "::load_state_dict: entry '", key,
                 "' is not a step count: ", v);
      steps[i] = static_cast<int64_t>(v);
      continue;
    }
    DPAR_CHECK(t.shape() == params_[i].shape(), name(), "::load_state_dict: entry '", key,
               "' has shape ", t.shape(), ", parameter ", i, " has shape ", params_[i].shape());
    DPAR_CHECK(t.dtype() == DType::f32, name(), "::load_state_dict: entry '", key, "' has dtype ",
               t.dtype(), ", expected f32");
    DPAR_CHECK(incoming[i].emplace(buf, t).second, name(), "::load_state_dict: entry '", key,
               "' appears twice");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool any = !incoming[i].empty() || steps[i] >= 0;
    if (!any) continue;
    for (const std::string& n : names) {
      DPAR_CHECK(incoming[i].count(n), name(), "::load_state_dict: parameter ", i,
                 " has state but no '", n, ".", i, "' entry");
    }
    DPAR_CHECK(!counts_steps() || steps[i] >= 0, name(), "::load_state_dict: parameter ", i,
               " has state but no 'step.", i, "' entry");
  }

  NoGradGuard no_grad;
  std::vector<ParamState> fresh(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (incoming[i].empty() && steps[i] < 0) continue;
    ParamState& st = fresh[i];
    st.initialized = true;
    st.step = std::max<int64_t>(steps[i], 0);
    // Copies, in the parameter's layout and on its device: the caller's tensors stay theirs.
    for (auto& [buf, t] : incoming[i]) {
      Tensor copy = Tensor::empty_like(params_[i]);
      copy.copy_(t);
      st.buffers[buf] = copy;
    }
  }
  state_ = std::move(fresh);
}

}  // namespace dpar::optim
