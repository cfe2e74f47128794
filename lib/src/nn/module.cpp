#include "dpar/nn/module.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "dpar/autograd/engine.h"
#include "dpar/autograd/grad_mode.h"

namespace dpar::nn {

namespace {

template <class List>
auto find_entry(List& list, const std::string& name) {
  return std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
}

// Splits "a.b.c" into ("a.b", "c"); a path without dots has an empty head.
std::pair<std::string, std::string> split_last(const std::string& path) {
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return {std::string(), path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

}  // namespace

std::string LoadReport::str() const {
  std::ostringstream os;
  for (const auto& name : missing) os << "missing: " << name << '\n';
  for (const auto& name : unexpected) os << "unexpected: " << name << '\n';
  for (const auto& m : mismatched) {
    os << "shape mismatch: " << m.name << ": module has " << shape_str(m.expected)
       << ", source has " << shape_str(m.got) << '\n';
  }
  return os.str();
}

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}
Module::~Module() = default;

Tensor Module::forward(const Tensor&) {
  DPAR_FAIL(type_name_, "::forward: this module has no forward computation");
}

// ---- registration ------------------------------------------------------------------------
void Module::check_new_name(const std::string& name, const char* what) const {
  DPAR_CHECK(!name.empty(), type_name_, "::", what, ": name must not be empty");
  DPAR_CHECK(name.find('.') == std::string::npos, type_name_, "::", what, ": name '", name,
             "' must not contain '.'");
  const bool taken = find_entry(parameters_, name) != parameters_.end() ||
                     find_entry(buffers_, name) != buffers_.end() ||
                     find_entry(children_, name) != children_.end();
  DPAR_CHECK(!taken, type_name_, "::", what, ": '", name, "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "register_parameter");
  DPAR_CHECK(tensor.defined(), type_name_, "::register_parameter: '", name, "' is undefined");
  DPAR_CHECK(tensor.is_leaf(), type_name_, "::register_parameter: '", name,
             "' has autograd history; register a leaf (use detach())");
  tensor.set_requires_grad(requires_grad);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "register_buffer");
  DPAR_CHECK(tensor.defined(), type_name_, "::register_buffer: '", name, "' is undefined");
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, ModulePtr module) {
  check_new_name(name, "register_module");
  DPAR_CHECK(module != nullptr, type_name_, "::register_module: '", name, "' is null");
  DPAR_CHECK(module.get() != this, type_name_, "::register_module: a module cannot contain itself");
  children_.emplace_back(name, std::move(module));
}

// ---- traversal ---------------------------------------------------------------------------
void Module::collect_parameters(const std::string& prefix, bool recurse, NamedTensors& out) const {
  for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, m] : children_) m->collect_parameters(prefix + name + ".", true, out);
}

void Module::collect_buffers(const std::string& prefix, bool recurse, NamedTensors& out) const {
  for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, m] : children_) m->collect_buffers(prefix + name + ".", true, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect_parameters("", recurse, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_parameters(recurse)) out.push_back(std::move(entry.second));
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect_buffers("", recurse, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_buffers(recurse)) out.push_back(std::move(entry.second));
  return out;
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_children() const { return children_; }

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (const auto& entry : children_) out.push_back(entry.second);
  return out;
}

void Module::collect_modules(const std::string& prefix,
                             std::vector<std::pair<std::string, Module*>>& out) const {
  // Children are shared and mutable through their shared_ptr anyway; a const traversal
  // handing out mutable pointers adds no new access.
  out.emplace_back(prefix, const_cast<Module*>(this));
  for (const auto& [name, m] : children_) {
    m->collect_modules(prefix.empty() ? name : prefix + "." + name, out);
  }
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& entry : children_) entry.second->apply(fn);
  fn(*this);
}

ModulePtr Module::child(const std::string& path) const {
  const Module* current = this;
  ModulePtr found;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    auto it = find_entry(current->children_, part);
    DPAR_CHECK(it != current->children_.end(), type_name_, ": no submodule '", path, "' (no '",
               part, "' in ", current->type_name_, ")");
    found = it->second;
    current = found.get();
    if (dot == std::string::npos) return found;
    start = dot + 1;
  }
}

Tensor Module::parameter(const std::string& path) const {
  auto [head, leaf] = split_last(path);
  const Module* owner = head.empty() ? this : child(head).get();
  auto it = find_entry(owner->parameters_, leaf);
  DPAR_CHECK(it != owner->parameters_.end(), type_name_, ": no parameter '", path, "'");
  return it->second;
}

Tensor Module::buffer(const std::string& path) const {
  auto [head, leaf] = split_last(path);
  const Module* owner = head.empty() ? this : child(head).get();
  auto it = find_entry(owner->buffers_, leaf);
  DPAR_CHECK(it != owner->buffers_.end(), type_name_, ": no buffer '", path, "'");
  return it->second;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& entry : named_parameters()) n += entry.second.numel();
  return n;
}

// ---- state dict --------------------------------------------------------------------------
void Module::collect_state(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, m] : children_) m->collect_state(prefix + name + ".", out);
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect_state("", out);
  for (auto& entry : out) entry.second = entry.second.detach();
  return out;
}

namespace {

// Matches a source against the module's own entries; fills `report`, and `to_copy` with the
// (destination, source) pairs that can be copied.
void match_state(const std::string& type_name, const NamedTensors& own, const NamedTensors& entries,
                 LoadReport& report, std::vector<std::pair<Tensor, const Tensor*>>* to_copy) {
  std::unordered_map<std::string, const Tensor*> source;
  source.reserve(entries.size());
  for (const auto& [name, t] : entries) {
    DPAR_CHECK(t.defined(), type_name, "::load_state_dict: entry '", name, "' is undefined");
    DPAR_CHECK(source.emplace(name, &t).second, type_name, "::load_state_dict: entry '", name,
               "' appears twice in the source");
  }
  std::unordered_set<std::string> known;
  for (const auto& [name, t] : own) {
    known.insert(name);
    auto it = source.find(name);
    if (it == source.end()) {
      report.missing.push_back(name);
    } else if (it->second->shape() != t.shape()) {
      report.mismatched.push_back({name, t.shape(), it->second->shape()});
    } else if (to_copy) {
      to_copy->emplace_back(t, it->second);
    }
  }
  for (const auto& [name, t] : entries) {
    if (!known.count(name)) report.unexpected.push_back(name);
  }
}

}  // namespace

LoadReport Module::compare_state_dict(const NamedTensors& entries) const {
  NamedTensors own;
  collect_state("", own);
  LoadReport report;
  match_state(type_name_, own, entries, report, nullptr);
  return report;
}

LoadReport Module::load_state_dict(const NamedTensors& entries, bool strict) {
  NamedTensors own;
  collect_state("", own);
  LoadReport report;
  std::vector<std::pair<Tensor, const Tensor*>> to_copy;
  match_state(type_name_, own, entries, report, &to_copy);
  if (strict && !report.ok()) {
    const size_t problems =
        report.missing.size() + report.unexpected.size() + report.mismatched.size();
    DPAR_FAIL(type_name_, "::load_state_dict: ", problems, " problem(s), nothing was loaded:\n",
              report.str());
  }
  NoGradGuard no_grad;
  for (auto& [dst, src] : to_copy) dst.copy_(*src);
  return report;
}

// ---- modes and gradients -----------------------------------------------------------------
void Module::train(bool on) {
  training_ = on;
  for (auto& entry : children_) entry.second->train(on);
}

Module& Module::to(Device device) {
  check_device_available(device);
  NoGradGuard no_grad;
  std::unordered_set<const TensorImpl*> moved;
  // On a GPU 4-D parameters (convolution weights) are laid out channels-last, the layout
  // conv2d hands cuDNN there (as PyTorch's model.to(memory_format=torch.channels_last)): no
  // copy per step, and their gradients come out in the same layout.
  auto placed = [&](const Tensor& t) {
    Tensor there = t.to(device);
    if (device.is_cuda() && there.dim() == 4) there = there.contiguous(MemoryFormat::ChannelsLast);
    return there;
  };
  auto move = [&](const Tensor& t) {
    if (!t.defined() || !moved.insert(t.impl()).second || t.device() == device) return;
    const Tensor there = placed(t.detach());
    TensorImpl& impl = *t.impl();
    impl.storage = there.storage();
    impl.offset = there.storage_offset();
    impl.strides = there.strides();
    if (Tensor grad = t.grad(); grad.defined()) {
      Tensor handle = t;  // shares the impl
      handle.set_grad(placed(grad));
    }
  };
  for (const Tensor& p : parameters()) move(p);
  for (const Tensor& b : buffers()) move(b);
  return *this;
}

void Module::zero_grad(bool set_to_none) { autograd::zero_grad(parameters(), set_to_none); }

// ---- printing ----------------------------------------------------------------------------
void Module::repr_into(std::string& out, int indent) const {
  out += type_name_ + "(" + extra_repr();
  if (!children_.empty()) {
    out += "\n";
    for (const auto& [name, m] : children_) {
      out += std::string(static_cast<size_t>(indent + 2), ' ') + "(" + name + "): ";
      m->repr_into(out, indent + 2);
      out += "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ');
  }
  out += ")";
}

std::string Module::repr() const {
  std::string out;
  repr_into(out, 0);
  return out;
}

}  // namespace dpar::nn
