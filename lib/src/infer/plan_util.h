#pragma once
// Small oneDNN helpers shared by the planner's files.
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "dpar/tensor/tensor.h"
#include "infer/graph.h"

namespace dpar::infer::detail {

inline constexpr auto kF32 = dnnl::memory::data_type::f32;

dnnl::engine& engine();
dnnl::stream& stream();

// Row-major (NCHW for 4-D) layout of dims.
dnnl::memory::desc plain_md(const Shape& dims);
// True when md's bytes are laid out row-major over its logical dims (strides of size-1
// dimensions do not matter), so a plain descriptor of any compatible shape views them.
bool is_plain(const dnnl::memory::desc& md);
// "nchw", "nhwc", "nChw8c", "nc", ...
std::string describe_layout(const dnnl::memory::desc& md);
// "" for f32, else ":u8", ":s8", ... (for plan summaries).
std::string data_type_suffix(const dnnl::memory::desc& md);
// oneDNN's reference kernels are its slow fallback ("ref:any").
bool is_reference(const std::string& impl);
// The activation layout for f32 convolutions: oneDNN's blocked layout for this CPU's widest
// vectors (nChw16c with AVX-512, nChw8c with AVX/AVX2), or undef (let oneDNN choose) elsewhere.
// Why not oneDNN's own choice: with AVX-512, oneDNN 2.6 answers `any` with its brgemm kernels
// on NHWC, which on MobileNetV3's 1x1 and depthwise shapes are slower than its direct jit
// kernels on nChw16c (issue 23: ~61 -> ~49 ms per batch-32 forward on one core; alone, the
// 88-channel 3x3 depthwise layer 1.84 -> 1.05 ms), and the stem's output needs no reorder.
dnnl::memory::format_tag blocked_activation_tag();
// The profile's name for a convolution of input shape x (bench_infer sorts onnxruntime's
// nodes by the same rule): "conv depthwise 3x3", "conv 1x1", "conv 1x1 on 1x1 maps", ...
std::string conv_category(const Op& op, const Shape& x);
// Scratchpads are supplied by the plan (one buffer for all steps), never allocated per call.
dnnl::primitive_attr user_scratchpad_attr();

// Work (multiply-adds of a convolution or inner product, elements for the other ops) below
// which a step is built and run on the calling thread alone: waking a second thread and
// joining it costs a few microseconds, more than such a step saves by sharing (at batch 1 on
// 2 threads, MobileNetV3's SE layers: their 1x1 convolutions on 1x1 maps and their multiplies,
// each 19-83 thousand of either). DPAR_INFER_ONE_THREAD_WORK, read when a plan is built,
// overrides it (0: every step on all threads).
int64_t one_thread_work();

// Scoped OpenMP thread count for the calling thread (omp_set_num_threads affects no other);
// n <= 0 leaves it as it is.
class ThreadScope {
 public:
  explicit ThreadScope(int n) : previous_(omp_get_max_threads()), active_(n > 0) {
    if (active_) omp_set_num_threads(n);
  }
  ~ThreadScope() {
    if (active_) omp_set_num_threads(previous_);
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_;
  bool active_;
};

}  // namespace dpar::infer::detail
