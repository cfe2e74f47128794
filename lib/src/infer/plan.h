#pragma once
// An execution plan: a detail::Program specialised to one input shape and thread count.
// Building it infers every shape, fuses activations and residual additions into the
// convolution / inner product that feeds them (oneDNN post-ops), creates the oneDNN
// primitives (layouts chosen by oneDNN, reorders only where a consumer wants another layout),
// reorders weights through the shared WeightCache, and packs the activations into a few
// reused buffers. run() then only executes the prepared primitives.
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "infer/graph.h"

namespace dpar::infer::detail {

// Weights in the layouts primitives asked for, shared by the plans of one model: each op's
// weights are reordered once per distinct layout (in practice once).
class WeightCache {
 public:
  dnnl::memory get(size_t op_index, const Tensor& plain, const dnnl::memory::desc& plain_md,
                   const dnnl::memory::desc& wanted);

 private:
  struct Entry {
    size_t op_index;
    dnnl::memory::desc md;
    Tensor storage;
    dnnl::memory memory;
  };
  std::vector<Entry> entries_;
};

class Plan {
 public:
  // last_value < 0: the whole program, its first layers possibly sub-batched (plan_prefix.cpp).
  // Otherwise only the steps up to the one writing last_value, kept for the caller to read: the
  // plan of a sub-batched prefix.
  Plan(const Program& program, WeightCache& weights, const Shape& input_dims, int last_value = -1);
  // input: a contiguous f32 tensor of the plan's input shape.
  Tensor run(const Tensor& input);
  const std::vector<std::string>& summary() const { return summary_; }

 private:
  struct Value {
    Shape dims;
    dnnl::memory::desc md;
    bool external = false;       // the caller's input (or a view of it), or a constant
    int buffer = -1;             // index into buffers_, for computed values
    float qscale = 0;            // > 0: stored as u8/s8 (md's data type), value = qscale * integer
    float grid = 0;              // > 0: f32 values that are multiples of grid (Fused::requant_f32)
    bool grid_unsigned = false;  // ... from 0 to 255 times grid, else from -128 to 127
    dnnl::memory memory;         // over the value's storage; bound at the end of planning
  };
  struct Arg {
    int arg;                               // DNNL_ARG_*
    int value;                             // value id
    std::optional<dnnl::memory::desc> md;  // another view of the same bytes
  };
  struct Step {
    std::optional<dnnl::primitive> prim;  // empty for a pure view (Flatten of plain data)
    // dpar's own computation in place of a primitive (global_pool.h), given the step's args.
    std::function<void(const std::unordered_map<int, dnnl::memory>&)> kernel;
    std::vector<Arg> value_args;
    std::unordered_map<int, dnnl::memory> fixed_args;  // weights, bias
    dnnl::memory::desc scratchpad_md;
    std::vector<int> reads;
    int dst = -1;
    int reuse = -1;                         // a read whose buffer dst may take over if it dies here
    bool reuse_required = false;            // dst must start as a copy of `reuse` (sum post-op)
    bool view = false;                      // dst is a view of `reuse` (no computation)
    std::optional<dnnl::reorder> pre_copy;  // set when a required reuse was impossible
    std::unordered_map<int, dnnl::memory> args;
    std::string text;      // for summary()
    std::string category;  // for the profile (DPAR_PROFILE): "conv depthwise 3x3", "reorder", ...
    bool per_sample = false;  // each image's result depends on that image alone (4-D, no Gemm)
    bool one_thread = false;  // built and run on the calling thread alone (one_thread_work)
  };
  struct PostOp {
    bool sum = false;
    Eltwise act{dnnl::algorithm::eltwise_relu};
    int operand = -1;  // sum: the value added in place
  };
  struct Fused {
    size_t op_index;
    std::vector<PostOp> post;
    int dst;
    std::vector<std::string> nodes;  // the ONNX nodes it computes, for summary()
    // An int8 Conv/Gemm, or a Binary, whose result only int8 layers read (int8 Conv/Gemm, or
    // ones computed in f32 on their dequantized input): written as u8/s8 with this scale
    // (requantisation, Plan::set_requant), so the next layer needs no quantizing pass.
    float requant = 0;
    bool requant_unsigned = false;
    // With requant: every reader computes in f32 on its dequantized input (Op::Int8::f32), so
    // the producer writes f32 values on the integers' grid (quantized and dequantized by its
    // post-ops) instead of the integers: no dequantizing pass.
    bool requant_f32 = false;
    // The destination's type when requantising to integers (u8/s8), else f32.
    dnnl::memory::data_type dst_type() const {
      if (requant == 0 || requant_f32) return dnnl::memory::data_type::f32;
      return requant_unsigned ? dnnl::memory::data_type::u8 : dnnl::memory::data_type::s8;
    }
  };

  std::vector<Fused> fuse() const;
  // Sets f's requantisation for these readers of its result (fuse() says when). integers: the
  // producer can write u8/s8; grid: f32 on the grid, for readers that all compute in f32.
  void set_requant(Fused& f, const std::vector<int>& readers, bool integers, bool grid) const;
  // Multiply-adds of a fused Conv/Gemm, elements of any other op's result (of its input for
  // pooling), for one_thread_work.
  int64_t work_of(const Fused& f) const;
  void build_conv(const Fused& f);
  void build_gemm(const Fused& f);
  void build_conv_int8(const Fused& f);  // plan_int8.cpp
  void build_gemm_int8(const Fused& f);
  // The step of an int8 Conv/Gemm: weights reordered once, the f32 bias, the residual operand.
  // as_1x1_conv: a Gemm computed by a 1x1 convolution over its 2-D values' bytes.
  void finish_int8_step(const Fused& f, int src, const dnnl::memory::desc& w_plain,
                        const dnnl::memory::desc& bias_md, const dnnl::primitive_desc_base& pd,
                        dnnl::primitive prim, bool as_1x1_conv = false);
  void build_eltwise(const Op& op);
  void build_binary(const Fused& f);
  void build_pool(const Op& op);
  void build_flatten(const Op& op);
  void build_softmax(const Op& op);
  // Reorders into a new value if needed; to an s8/u8 md from f32, quantizes with qscale.
  int to_layout(int value, const dnnl::memory::desc& md, float qscale = 0);
  // The f32 input of an op computed in f32 on its dequantized input (Op::Int8::f32): the
  // producer's value where it is on the op's grid, else an NHWC dequantized copy.
  int dequantized(int value, const Op& op);
  int new_value(const Shape& dims, const dnnl::memory::desc& md);
  dnnl::primitive_attr post_op_attr(const Fused& f) const;
  void add_sum_operand(Step& step, const Fused& f, const dnnl::memory::desc& dst_md);
  void finish_step(Step step, const dnnl::primitive_desc_base& pd, dnnl::primitive prim,
                   const std::string& what, const std::vector<std::string>& nodes);
  // The part both kinds of step share; a step computed by step.kernel comes here directly, its
  // kernel's name as `impl` (for summaries) and an empty scratchpad.
  void finish_step(Step step, const std::string& impl, const dnnl::memory::desc& scratchpad_md,
                   const std::string& what, const std::vector<std::string>& nodes);
  void assign_buffers();
  void bind();
  void run_steps(size_t first, size_t last);
  // plan_prefix.cpp: where to end the sub-batched prefix (0: nowhere), building it, running it.
  size_t prefix_cut() const;
  void plan_prefix(const Shape& input_dims);
  void run_prefix(const Tensor& input);

  const Program& program_;
  WeightCache& weights_;
  std::vector<Value> values_;
  std::vector<Step> steps_;
  std::vector<std::array<int64_t, 4>> conv_pads_;  // per op, resolved auto_pad
  std::vector<std::pair<int, int>> reordered_;     // (value, its copy in another layout)
  std::vector<size_t> buffer_bytes_;
  std::vector<Tensor> buffers_;
  Tensor scratchpad_;
  size_t scratchpad_bytes_ = 0;
  std::vector<dnnl::memory> input_memories_;  // re-pointed at the caller's input every run
  std::optional<dnnl::reorder> to_output_;
  bool output_one_thread_ = false;  // to_output_ is small enough for one thread
  dnnl::memory output_plain_;
  std::vector<std::string> summary_;
  // The sub-batched prefix: steps [0, prefix_steps_) run on prefix_plan_ (this program's
  // steps up to boundary_ for one image) image by image, each image's boundary_ value copied
  // into this plan's; this plan then runs the rest. It holds no buffers for the prefix's other
  // values.
  std::unique_ptr<Plan> prefix_plan_;
  int last_value_ = -1;  // a prefix's plan: the value it ends with (else the program's output)
  int64_t one_thread_work_ = 0;       // one_thread_work(), read once per plan
  bool building_one_thread_ = false;  // the steps being built get Step::one_thread
  size_t prefix_steps_ = 0;
  int boundary_ = -1;
};

}  // namespace dpar::infer::detail
