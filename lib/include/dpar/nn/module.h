#pragma once
// nn::Module: a tree of named parameters, buffers and child modules, in the spirit of the
// libtorch C++ frontend and with torch's state-dict naming and ordering, so that weights move
// between dpar and PyTorch by name (`features.1.block.0.0.weight`).
//
// Modules are held by std::shared_ptr. A layer keeps its parameters as Tensor members that are
// the very handles it registered, so parameters() hands out the tensors forward() uses:
// in-place updates (optimizers, load_state_dict) and set_grad() (DataParallel) act on them.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::nn {

// Ordered (name, tensor) pairs: state dicts, safetensors contents.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module;
using ModulePtr = std::shared_ptr<Module>;

struct ShapeMismatch {
  std::string name;
  Shape expected;  // the module's shape
  Shape got;       // the source's shape
};

// What load_state_dict found. Matching entries were copied; the others were left alone.
struct LoadReport {
  std::vector<std::string> missing;       // in the module, absent from the source
  std::vector<std::string> unexpected;    // in the source, unknown to the module
  std::vector<ShapeMismatch> mismatched;  // in both, with different shapes (not copied)
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  std::string str() const;  // one problem per line; empty when ok()
};

class Module {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The base version throws: containers without a forward (a plain
  // Module used as a namespace of children) must not be called.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  const std::string& type_name() const { return type_name_; }

  // ---- registration (names are unique across parameters, buffers and children; no dots) ---
  // Marks tensor as requiring grad (it must be a floating leaf) and returns the same handle.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- traversal; every list is in registration order, recursion is depth-first ----------
  // Virtual (with named_buffers and the state-dict functions) so that wrappers such as
  // dist::DataParallel can present the wrapped module's own names.
  virtual NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  virtual NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, ModulePtr>> named_children() const;
  std::vector<ModulePtr> children() const;
  // This module (name "") and all descendants, pre-order. Pointers are non-owning.
  std::vector<std::pair<std::string, Module*>> named_modules() const;
  // Calls fn on every descendant and then on this module (torch's Module.apply order).
  void apply(const std::function<void(Module&)>& fn);

  // Lookup by dotted path ("features.0.1.weight"); throws dpar::Error naming the path.
  Tensor parameter(const std::string& path) const;
  Tensor buffer(const std::string& path) const;
  ModulePtr child(const std::string& path) const;

  // Total elements over all parameters.
  int64_t num_parameters() const;

  // ---- state dict ----------------------------------------------------------------------
  // Per module: its parameters, then its buffers, then each child's entries under
  // "<child>." - exactly torch.nn.Module.state_dict()'s order. The tensors are detached
  // handles that share memory with the module.
  virtual NamedTensors state_dict() const;
  // Copies matching entries into the module's tensors in place (any dtype/layout is
  // converted). strict: any missing / unexpected / mis-shaped entry throws a dpar::Error that
  // lists every problem, and nothing is copied. Not strict: copies what matches and reports.
  virtual LoadReport load_state_dict(const NamedTensors& entries, bool strict = true);
  // What load_state_dict(entries) would report, without copying anything.
  virtual LoadReport compare_state_dict(const NamedTensors& entries) const;

  // ---- modes and gradients ---------------------------------------------------------------
  virtual void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and buffer (and any gradient) of this module and its descendants to
  // `device`, in place like torch's Module.to: the handles modules registered, and optimizers
  // or hooks hold, keep pointing at the moved tensors. Throws dpar::Error naming the device
  // when it cannot be used (no GPU, bad index, built without CUDA). On a CUDA device 4-D
  // parameters and buffers (convolution weights) are laid out channels-last, the layout conv2d
  // uses there.
  Module& to(Device device);
  // Zeroes gradients in place (gradients may be views into DataParallel buckets), or drops
  // them when set_to_none. Virtual: a sharded DataParallel also zeroes its gradient slices.
  virtual void zero_grad(bool set_to_none = false);

  // Indented structure, like printing a torch module.
  std::string repr() const;

 protected:
  // Shown in repr() between the parentheses, e.g. "16, 32, kernel_size=3, stride=2".
  virtual std::string extra_repr() const { return {}; }
  // For a subclass that is its base under torch's other name (BatchNorm1d of BatchNorm2d).
  void set_type_name(std::string name) { type_name_ = std::move(name); }

 private:
  void check_new_name(const std::string& name, const char* what) const;
  void add_child(const std::string& name, ModulePtr module);
  void collect_parameters(const std::string& prefix, bool recurse, NamedTensors& out) const;
  void collect_buffers(const std::string& prefix, bool recurse, NamedTensors& out) const;
  void collect_state(const std::string& prefix, NamedTensors& out) const;
  void collect_modules(const std::string& prefix,
                       std::vector<std::pair<std::string, Module*>>& out) const;
  void repr_into(std::string& out, int indent) const;

  std::string type_name_;
  bool training_ = true;
  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
};

}  // namespace dpar::nn
