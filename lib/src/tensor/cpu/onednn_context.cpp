#include "tensor/cpu/onednn_context.h"

#include <omp.h>

#include <cstdlib>
#include <mutex>

namespace dpar::cpu::onednn {

// The engine and the cache are deliberately never destroyed: cached primitives refer to
// the engine, and static destruction order at exit would otherwise be unspecified between them.
dnnl::engine& engine() {
  static dnnl::engine* eng = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *eng;
}

// One stream per calling thread: oneDNN streams are not meant to be shared between threads,
// and on the CPU a primitive runs synchronously in the thread that executes it.
dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

bool isa_covers(dnnl::cpu_isa isa) {
  // oneDNN 2.6's ISA values are bit sets: a superset holds all of a subset's bits.
  const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bits = static_cast<unsigned>(isa);
  return (effective & bits) == bits;
}

bool has_int8_dot_product() {
  return isa_covers(dnnl::cpu_isa::avx512_core_vnni) || isa_covers(dnnl::cpu_isa::avx2_vnni);
}

Key::Key(Kind kind) {
  values_.reserve(24);
  values_.push_back(static_cast<int64_t>(kind));
  values_.push_back(omp_get_max_threads());
}

size_t Key::hash() const {
  // FNV-1a over the 64-bit values: keys are short, so this is cheap and spreads well.
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : values_) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ull;
  }
  return static_cast<size_t>(h);
}

namespace {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::conv_forward:
      return "conv2d forward";
    case Kind::conv_backward_data:
      return "conv2d backward-data";
    case Kind::conv_backward_weights:
      return "conv2d backward-weights";
    case Kind::batch_norm_forward:
      return "batch_norm forward";
    case Kind::batch_norm_backward:
      return "batch_norm backward";
    case Kind::matmul:
      return "linear (matmul)";
  }
  return "unknown";
}

const char* kind_name(dnnl::primitive::kind kind) {
  switch (kind) {
    case dnnl::primitive::kind::convolution:
      return "convolution";
    case dnnl::primitive::kind::batch_normalization:
      return "batch normalization";
    case dnnl::primitive::kind::reorder:
      return "reorder";
    default:
      return "oneDNN";
  }
}

}  // namespace

namespace detail {

std::shared_ptr<const void> cached(const Key& key,
                                   const std::function<std::shared_ptr<const void>()>& make) {
  static std::mutex mutex;
  static auto& cache = *new std::unordered_map<Key, std::shared_ptr<const void>, KeyHash>();
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::shared_ptr<const void> entry;
  try {
    entry = make();
  } catch (const dnnl::error& e) {
    DPAR_FAIL("oneDNN could not create the ", kind_name(key.kind()), " primitive: ", e.what());
  }
  std::lock_guard<std::mutex> lock(mutex);
  // Another thread may have built the same entry meanwhile; keep the first so every caller
  // shares one primitive.
  return cache.emplace(key, std::move(entry)).first->second;
}

}  // namespace detail

dnnl::primitive_attr default_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::memory::data_type data_type(DType t, const char* op) {
  DPAR_CHECK(t == DType::f32 || t == DType::bf16, op, " on the CPU supports f32 and bf16, got ", t);
  return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

dnnl::memory wrap(const dnnl::memory::desc& md, const Tensor& t) {
  return dnnl::memory(md, engine(), t.raw_data());
}

OwnedMemory allocate(const dnnl::memory::desc& md) {
  const int64_t floats = static_cast<int64_t>((md.get_size() + sizeof(float) - 1) / sizeof(float));
  OwnedMemory out;
  out.buffer = Tensor::empty({floats});
  out.memory = dnnl::memory(md, engine(), out.buffer.raw_data());
  return out;
}

namespace {

// Grows to the largest scratchpad seen on this thread and is reused by every primitive that
// runs here (primitives execute one at a time per thread).
class Scratchpad {
 public:
  ~Scratchpad() { std::free(data_); }
  void* get(size_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      size_ = (bytes + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, size_);
      DPAR_CHECK(data_ != nullptr, "oneDNN scratchpad: out of memory allocating ", size_, " bytes");
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

void execute(const dnnl::primitive& prim, const dnnl::memory::desc& scratchpad_md,
             std::unordered_map<int, dnnl::memory> args) {
  thread_local Scratchpad scratchpad;
  const size_t bytes = scratchpad_md.get_size();
  if (bytes > 0) {
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratchpad_md, engine(), scratchpad.get(bytes)));
  }
  try {
    prim.execute(stream(), args);
    stream().wait();
  } catch (const dnnl::error& e) {
    DPAR_FAIL("oneDNN could not execute a ", kind_name(prim.get_kind()), " primitive: ", e.what());
  }
}

}  // namespace dpar::cpu::onednn
