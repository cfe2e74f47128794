#pragma once
// The process-wide oneDNN CPU engine, a per-thread stream, a cache of primitives, and per-thread
// scratchpads. Creating a oneDNN primitive descriptor walks the implementation list and JITs
// kernels (hundreds of microseconds to milliseconds), so every primitive is built once per
// (op, shapes, strides, attributes, thread count) and reused on later calls.
#include <cstdint>
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::cpu::onednn {

dnnl::engine& engine();
dnnl::stream& stream();
// Whether the ISA oneDNN dispatches to (after ONEDNN_MAX_CPU_ISA) includes `isa`'s features.
bool isa_covers(dnnl::cpu_isa isa);
// Whether oneDNN's int8 kernels have a dot-product instruction (VNNI) that accumulates u8 x s8
// products in 32 bits. Without it they add pairs of products in 16 bits (vpmaddubsw), which
// large values saturate (infer/lower.cpp's make_int8 and plan_int8.cpp say what dpar does).
bool has_int8_dot_product();

// Identifies a cached entry. The kind tag keeps entries of different ops apart; the current
// OpenMP thread count is always part of the key because oneDNN tunes its blocking to it.
enum class Kind : int64_t {
  conv_forward,
  conv_backward_data,
  conv_backward_weights,
  batch_norm_forward,
  batch_norm_backward,
  matmul,
};

class Key {
 public:
  explicit Key(Kind kind);
  Key& add(int64_t value) {
    values_.push_back(value);
    return *this;
  }
  Kind kind() const { return static_cast<Kind>(values_[0]); }
  bool operator==(const Key& other) const { return values_ == other.values_; }
  size_t hash() const;

 private:
  std::vector<int64_t> values_;
};

struct KeyHash {
  size_t operator()(const Key& key) const { return key.hash(); }
};

namespace detail {
// Returns the entry for key, creating it with make() on first use. Entries live for the
// process; make() runs without the cache lock held so a slow JIT does not serialise callers.
std::shared_ptr<const void> cached(const Key& key,
                                   const std::function<std::shared_ptr<const void>()>& make);
}  // namespace detail

template <class Entry>
const Entry& cached(const Key& key, const std::function<Entry()>& make) {
  auto entry = detail::cached(
      key, [&]() -> std::shared_ptr<const void> { return std::make_shared<const Entry>(make()); });
  return *static_cast<const Entry*>(entry.get());
}

// Attributes every cached primitive uses: the scratchpad is passed in by execute() so that
// primitives do not allocate on every call.
dnnl::primitive_attr default_attr();

// oneDNN's element type for an f32 or bf16 tensor (amp::Autocast's activations); other dtypes
// fail naming op.
dnnl::memory::data_type data_type(DType t, const char* op);

// A oneDNN memory object over a tensor's data (no copy); md must describe t's layout.
dnnl::memory wrap(const dnnl::memory::desc& md, const Tensor& t);

// A memory object with fresh storage for md (oneDNN's blocked layouts may pad past numel).
struct OwnedMemory {
  Tensor buffer;
  dnnl::memory memory;
};
OwnedMemory allocate(const dnnl::memory::desc& md);

// Runs prim on this thread's stream, supplying a per-thread scratchpad of scratchpad_md's size.
void execute(const dnnl::primitive& prim, const dnnl::memory::desc& scratchpad_md,
             std::unordered_map<int, dnnl::memory> args);

}  // namespace dpar::cpu::onednn
