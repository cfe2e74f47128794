// Plan: construction order, buffer assignment (liveness-based reuse and in-place execution),
// binding of memory objects, and the run loop. Per-op primitive creation is in plan_build.cpp.
#include "infer/plan.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "dpar/core/profiler.h"
#include "infer/plan_util.h"
#include "tensor/cpu/onednn_context.h"

namespace dpar::infer::detail {

using dnnl::memory;

dnnl::engine& engine() { return cpu::onednn::engine(); }
dnnl::stream& stream() { return cpu::onednn::stream(); }

memory::desc plain_md(const Shape& dims) {
  return memory::desc(dims, kF32, contiguous_strides(dims));
}

bool is_plain(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.offset0 != 0) {
    return false;
  }
  int64_t expect = 1;
  for (int i = d.ndims - 1; i >= 0; --i) {
    if (d.padded_dims[i] != d.dims[i]) return false;
    if (d.dims[i] != 1 && d.format_desc.blocking.strides[i] != expect) return false;
    expect *= d.dims[i];
  }
  return true;
}

std::string describe_layout(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked) return "opaque";
  const std::string names = d.ndims == 4 ? "nchw" : d.ndims == 2 ? "nc" : "abcdef";
  std::vector<int> order(static_cast<size_t>(d.ndims));
  for (int i = 0; i < d.ndims; ++i) order[static_cast<size_t>(i)] = i;
  const auto& blk = d.format_desc.blocking;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return blk.strides[a] > blk.strides[b]; });
  std::string out;
  for (int i : order) {
    char c = names[static_cast<size_t>(i)];
    for (int k = 0; k < blk.inner_nblks; ++k) {
      if (blk.inner_idxs[k] == i) c = static_cast<char>(c - 'a' + 'A');
    }
    out += c;
  }
  for (int k = 0; k < blk.inner_nblks; ++k) {
    out += std::to_string(blk.inner_blks[k]) + names[static_cast<size_t>(blk.inner_idxs[k])];
  }
  return out;
}

std::string data_type_suffix(const memory::desc& md) {
  switch (md.data_type()) {
    case memory::data_type::f32:
      return "";
    case memory::data_type::u8:
      return ":u8";
    case memory::data_type::s8:
      return ":s8";
    case memory::data_type::s32:
      return ":s32";
    default:
      return ":other";
  }
}

bool is_reference(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

memory::format_tag blocked_activation_tag() {
  if (cpu::onednn::isa_covers(dnnl::cpu_isa::avx512_core)) return memory::format_tag::nChw16c;
  if (cpu::onednn::isa_covers(dnnl::cpu_isa::avx)) return memory::format_tag::nChw8c;
  return memory::format_tag::undef;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

memory WeightCache::get(size_t op_index, const Tensor& plain, const memory::desc& plain_md,
                        const memory::desc& wanted) {
  for (const Entry& e : entries_) {
    if (e.op_index == op_index && e.md == wanted) return e.memory;
  }
  Entry e{op_index, wanted, plain, memory()};
  if (wanted == plain_md) {
    e.memory = memory(wanted, engine(), plain.raw_data());
  } else {
    const int64_t floats = static_cast<int64_t>((wanted.get_size() + 3) / 4);
    e.storage = Tensor::zeros({floats});
    e.memory = memory(wanted, engine(), e.storage.raw_data());
    memory from(plain_md, engine(), plain.raw_data());
    dnnl::reorder(from, e.memory).execute(stream(), from, e.memory);
    stream().wait();
  }
  entries_.push_back(e);
  return e.memory;
}

int64_t one_thread_work() {
  if (const char* env = std::getenv("DPAR_INFER_ONE_THREAD_WORK")) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    DPAR_CHECK(end != env && *end == 0 && v >= 0,
               "DPAR_INFER_ONE_THREAD_WORK: expected a count of multiply-adds >= 0, got '", env,
               "'");
    return v;
  }
  return int64_t{1} << 17;
}

int64_t Plan::work_of(const Fused& f) const {
  const Op& op = program_.ops[f.op_index];
  auto elements = [&](int value) { return shape_numel(values_[static_cast<size_t>(value)].dims); };
  switch (op.kind) {
    case OpKind::Conv:
    case OpKind::Gemm:  // per output element, one weight row: K, or C/g * kH * kW
      return elements(f.dst) * (op.weight.numel() / op.weight.shape()[0]);
    case OpKind::GlobalAvgPool:
      return elements(op.src);
    default:
      return elements(op.dst);
  }
}

Plan::Plan(const Program& program, WeightCache& weights, const Shape& input_dims, int last_value)
    : program_(program),
      weights_(weights),
      last_value_(last_value),
      one_thread_work_(one_thread_work()) {
  values_.resize(program.value_names.size());
  Value& in = values_[static_cast<size_t>(program.input)];
  in.dims = input_dims;
  in.md = plain_md(input_dims);
  in.external = true;
  Shapes shapes = infer_shapes(program, input_dims);
  conv_pads_ = std::move(shapes.conv_pads);
  for (size_t v = 0; v < values_.size(); ++v) {
    values_[v].dims = std::move(shapes.dims[v]);
    if (!program.constants[v].defined()) continue;
    values_[v].md = plain_md(values_[v].dims);
    values_[v].external = true;
  }
  try {
    for (const Fused& f : fuse()) {
      if (last_value_ >= 0 && !steps_.empty() && steps_.back().dst == last_value_) break;
      const Op& op = program.ops[f.op_index];
      // Some primitives fix their thread count when created, so a small op is created, as
      // well as run, under one thread; so are the reorders of its operands, no larger than it.
      building_one_thread_ = omp_get_max_threads() > 1 && work_of(f) < one_thread_work_;
      ThreadScope scope(building_one_thread_ ? 1 : 0);
      switch (op.kind) {
        case OpKind::Conv:
          build_conv(f);
          break;
        case OpKind::Gemm:
          build_gemm(f);
          break;
        case OpKind::Eltwise:
          build_eltwise(op);
          break;
        case OpKind::Binary:
          build_binary(f);
          break;
        case OpKind::GlobalAvgPool:
          build_pool(op);
          break;
        case OpKind::Flatten:
          build_flatten(op);
          break;
        case OpKind::Softmax:
          build_softmax(op);
          break;
      }
      if (f.requant_f32) {
        values_[static_cast<size_t>(f.dst)].grid = f.requant;
        values_[static_cast<size_t>(f.dst)].grid_unsigned = f.requant_unsigned;
      }
    }
    building_one_thread_ = false;
    if (last_value_ < 0) plan_prefix(input_dims);
    assign_buffers();
    bind();
  } catch (const dnnl::error& e) {
    DPAR_FAIL(program.path, ": oneDNN cannot run this model for input ", input_dims, " (", e.what(),
              ")");
  }
  for (const Step& s : steps_) {
    summary_.push_back(s.pre_copy ? "copy residual + " + s.text : s.text);
  }
  if (prefix_plan_) {
    summary_.insert(summary_.begin(),
                    "steps 1-" + std::to_string(prefix_steps_) + " run one image at a time:");
    summary_.insert(summary_.begin() + 1 + static_cast<std::ptrdiff_t>(prefix_steps_),
                    "the rest on the whole batch:");
  }
}

// Greedy liveness-based assignment: a value's buffer returns to the pool after its last
// reader; a step writes in place of an input that dies at that step when layouts agree
// (activations, binary ops, softmax, and always for the residual of a sum post-op, which
// otherwise is first copied into a fresh buffer).
void Plan::assign_buffers() {
  const int end = static_cast<int>(steps_.size());
  const int first = static_cast<int>(prefix_steps_);  // the prefix's values live elsewhere
  std::vector<int> last_use(values_.size(), -1);
  for (int i = first; i < end; ++i) {
    for (int r : steps_[static_cast<size_t>(i)].reads) last_use[static_cast<size_t>(r)] = i;
  }
  last_use[static_cast<size_t>(last_value_ >= 0 ? last_value_ : program_.output)] = end;
  std::vector<int> refs;
  std::vector<int> free_list;
  auto allocate = [&](size_t bytes) {
    int best = -1;
    for (int b : free_list) {
      const size_t have = buffer_bytes_[static_cast<size_t>(b)];
      if (have >= bytes && (best < 0 || have < buffer_bytes_[static_cast<size_t>(best)])) best = b;
    }
    if (best < 0) {  // nothing fits: grow the largest free buffer, or open a new one
      for (int b : free_list) {
        if (best < 0 ||
            buffer_bytes_[static_cast<size_t>(b)] > buffer_bytes_[static_cast<size_t>(best)]) {
          best = b;
        }
      }
    }
    if (best < 0) {
      buffer_bytes_.push_back(0);
      refs.push_back(0);
      best = static_cast<int>(buffer_bytes_.size()) - 1;
    } else {
      free_list.erase(std::find(free_list.begin(), free_list.end(), best));
    }
    buffer_bytes_[static_cast<size_t>(best)] =
        std::max(buffer_bytes_[static_cast<size_t>(best)], bytes);
    refs[static_cast<size_t>(best)] = 1;
    return best;
  };
  if (boundary_ >= 0) {  // written slice by slice before the first step here
    Value& b = values_[static_cast<size_t>(boundary_)];
    b.buffer = allocate(b.md.get_size());
  }
  auto release = [&](int v) {
    const Value& val = values_[static_cast<size_t>(v)];
    if (val.external || val.buffer < 0) return;
    if (--refs[static_cast<size_t>(val.buffer)] == 0) free_list.push_back(val.buffer);
  };
  for (int i = first; i < end; ++i) {
    Step& s = steps_[static_cast<size_t>(i)];
    Value& d = values_[static_cast<size_t>(s.dst)];
    bool placed = false;
    if (s.reuse >= 0) {
      const Value& r = values_[static_cast<size_t>(s.reuse)];
      const bool read_twice = std::count(s.reads.begin(), s.reads.end(), s.reuse) > 1;
      if (s.view) {
        d.external = r.external;
        d.buffer = r.buffer;
        if (!r.external) ++refs[static_cast<size_t>(r.buffer)];
        placed = true;
      } else if (!r.external && !read_twice && last_use[static_cast<size_t>(s.reuse)] == i &&
                 refs[static_cast<size_t>(r.buffer)] == 1 && r.md == d.md) {
        d.buffer = r.buffer;
        ++refs[static_cast<size_t>(r.buffer)];
        placed = true;
      } else if (s.reuse_required) {
        ThreadScope scope(s.one_thread ? 1 : 0);  // created as it runs (run_steps)
        s.pre_copy = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), r.md, engine(), d.md));
      }
    }
    if (!placed) d.buffer = allocate(d.md.get_size());
    std::vector<int> reads = s.reads;
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    for (int r : reads) {
      if (last_use[static_cast<size_t>(r)] == i) release(r);
    }
    if (last_use[static_cast<size_t>(s.dst)] < 0) release(s.dst);  // computed but never read
  }
}

void Plan::bind() {
  for (size_t bytes : buffer_bytes_) {
    buffers_.push_back(Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}));
  }
  if (scratchpad_bytes_ > 0) {
    scratchpad_ = Tensor::empty({static_cast<int64_t>((scratchpad_bytes_ + 3) / 4)});
  }
  // The caller's input (and views of it) are bound per run; everything else now.
  auto make = [&](int v, const memory::desc& md) {
    const Value& val = values_[static_cast<size_t>(v)];
    const size_t id = static_cast<size_t>(v);
    // Values past the program's are the planner's temporaries, never constants.
    if (id < program_.constants.size() && program_.constants[id].defined()) {
      return memory(md, engine(), program_.constants[id].raw_data());
    }
    if (val.external) {
      memory m(md, engine(), nullptr);
      input_memories_.push_back(m);
      return m;
    }
    return memory(md, engine(), buffers_[static_cast<size_t>(val.buffer)].raw_data());
  };
  for (size_t v = 0; v < values_.size(); ++v) {
    Value& val = values_[v];
    if (val.md.get_size() == 0 && !val.external) continue;  // folded away, never materialised
    if (val.buffer >= 0 || val.external) val.memory = make(static_cast<int>(v), val.md);
  }
  for (size_t i = prefix_steps_; i < steps_.size(); ++i) {
    Step& s = steps_[i];
    for (const Arg& a : s.value_args) {
      s.args[a.arg] = a.md ? make(a.value, *a.md) : values_[static_cast<size_t>(a.value)].memory;
    }
    for (const auto& [arg, mem] : s.fixed_args) s.args[arg] = mem;
    if (s.scratchpad_md.get_size() > 0) {
      s.args[DNNL_ARG_SCRATCHPAD] = memory(s.scratchpad_md, engine(), scratchpad_.raw_data());
    }
  }
  if (last_value_ >= 0) return;  // a prefix's plan: its caller copies last_value out
  const Value& out = values_[static_cast<size_t>(program_.output)];
  output_plain_ = memory(plain_md(out.dims), engine(), nullptr);
  output_one_thread_ = omp_get_max_threads() > 1 && shape_numel(out.dims) < one_thread_work_;
  ThreadScope scope(output_one_thread_ ? 1 : 0);
  to_output_ = dnnl::reorder(out.memory, output_plain_);
}

void Plan::run_steps(size_t first, size_t last) {
  dnnl::stream& s = stream();
  const bool profiling = profiler::enabled();
  for (size_t i = first; i < last; ++i) {
    Step& step = steps_[i];
    if (!step.prim && !step.kernel && !step.pre_copy) continue;  // a view: nothing to compute
    const auto start =
        profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    {
      ThreadScope scope(step.one_thread ? 1 : 0);
      if (step.pre_copy) {  // the residual operand, as large as the output
        step.pre_copy->execute(s, values_[static_cast<size_t>(step.reuse)].memory,
                               values_[static_cast<size_t>(step.dst)].memory);
      }
      if (step.prim) step.prim->execute(s, step.args);
      if (step.kernel) step.kernel(step.args);
    }
    if (profiling) {
      // CPU primitives finish inside execute(); wait() only makes that explicit.
      s.wait();
      profiler::record("infer " + step.category,
                       std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count());
    }
  }
}

Tensor Plan::run(const Tensor& input) {
  for (memory& m : input_memories_) m.set_data_handle(input.raw_data());
  dnnl::stream& s = stream();
  const Value& out = values_[static_cast<size_t>(program_.output)];
  Tensor result = Tensor::empty(out.dims);
  try {
    if (prefix_plan_) run_prefix(input);
    run_steps(prefix_steps_, steps_.size());
    output_plain_.set_data_handle(result.raw_data());
    ThreadScope scope(output_one_thread_ ? 1 : 0);
    to_output_->execute(s, values_[static_cast<size_t>(program_.output)].memory, output_plain_);
    s.wait();
  } catch (const dnnl::error& e) {
    DPAR_FAIL(program_.path, ": oneDNN failed while running the model: ", e.what());
  }
  return result;
}

}  // namespace dpar::infer::detail
