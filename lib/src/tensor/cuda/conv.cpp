// Convolutions on cuDNN, without bias (conv2d adds it in f32): pointwise ones as cuBLAS GEMMs,
// the others through the graph API (conv_graph.cpp) and, where that has no engine or
// DPAR_CUDNN_API=legacy, the legacy descriptor API. For each shape the legacy descriptors are
// built once and each direction's algorithm is chosen once by timing the candidates on the real
// buffers (cudnnFind*, PyTorch's cudnn.benchmark = True), then cached with its workspace size.
#include <cudnn.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/conv_layout.h"
#include "tensor/cuda/conv_graph.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/cuda_libraries.h"
#include "tensor/linear_kernels.h"
#include "tensor/nn_kernels.h"

namespace dpar::cuda {
namespace {

using kernels::Conv2dGeometry;

// TF32 stays off for f32 unless asked for (DPAR_ALLOW_TF32=1), so f32 results match the CPU
// backend; PyTorch allows TF32 in cuDNN convolutions by default, the benchmark says which.
cudnnMathType_t math_type(DType t) {
  if (t != DType::f32) return CUDNN_TENSOR_OP_MATH;
  return tf32_allowed() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// The key of one convolution problem: geometry, the strides cuDNN is given for input, output
// and filter layout, dtype and device.
using PlanKey = std::tuple<std::vector<int64_t>, int, int>;

// One direction's algorithm as the search chose it: with the workspace it needs and the math
// type it was timed with (Find may report a different one than the descriptor asked for).
template <class Algo>
struct ChosenAlgo {
  bool chosen = false;
  Algo algo{};
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  ChosenAlgo<cudnnConvolutionFwdAlgo_t> fwd;
  ChosenAlgo<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  ChosenAlgo<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;
  std::string description;  // for DPAR_CUDNN_LOG_ALGOS
  ~ConvPlan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

// The filter layout: NHWC (KRSC) when the weights are laid out channels-last, as conv2d does on
// CUDA so that filter and activations match (mixed layouts leave cuDNN few, slow kernels). A
// weight whose memory is the same in both layouts (1x1, or one input channel per group) is
// described as NHWC too.
bool nhwc_filter(const Tensor& w) { return w.is_contiguous(MemoryFormat::ChannelsLast); }

void set_activation_desc(cudnnTensorDescriptor_t d, DType t, const Tensor& like,
                         const std::array<int64_t, 4>& strides) {
  check_cudnn(
      cudnnSetTensor4dDescriptorEx(d, cudnn_data_type(t), static_cast<int>(like.size(0)),
                                   static_cast<int>(like.size(1)), static_cast<int>(like.size(2)),
                                   static_cast<int>(like.size(3)), static_cast<int>(strides[0]),
                                   static_cast<int>(strides[1]), static_cast<int>(strides[2]),
                                   static_cast<int>(strides[3])),
      "cudnnSetTensor4dDescriptorEx");
}

std::unique_ptr<ConvPlan> make_plan(const Conv2dGeometry& g, DType t, const Tensor& x,
                                    const Tensor& y, const ConvLayout& layout) {
  auto p = std::make_unique<ConvPlan>();
  p->description = describe_conv(g, t, layout);
  const bool nhwc = layout.nhwc_filter;
  check_cudnn(cudnnCreateTensorDescriptor(&p->x), "cudnnCreateTensorDescriptor");
  check_cudnn(cudnnCreateTensorDescriptor(&p->y), "cudnnCreateTensorDescriptor");
  check_cudnn(cudnnCreateFilterDescriptor(&p->w), "cudnnCreateFilterDescriptor");
  check_cudnn(cudnnCreateConvolutionDescriptor(&p->conv), "cudnnCreateConvolutionDescriptor");
  set_activation_desc(p->x, t, x, layout.x_strides);
  set_activation_desc(p->y, t, y, layout.y_strides);
  check_cudnn(cudnnSetFilter4dDescriptor(p->w, cudnn_data_type(t),
                                         nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                         static_cast<int>(g.O), static_cast<int>(g.C / g.groups),
                                         static_cast<int>(g.kH), static_cast<int>(g.kW)),
              "cudnnSetFilter4dDescriptor");
  check_cudnn(cudnnSetConvolution2dDescriptor(
                  p->conv, static_cast<int>(g.padding[0]), static_cast<int>(g.padding[1]),
                  static_cast<int>(g.stride[0]), static_cast<int>(g.stride[1]),
                  static_cast<int>(g.dilation[0]), static_cast<int>(g.dilation[1]),
                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              "cudnnSetConvolution2dDescriptor");
  check_cudnn(cudnnSetConvolutionGroupCount(p->conv, static_cast<int>(g.groups)),
              "cudnnSetConvolutionGroupCount");
  check_cudnn(cudnnSetConvolutionMathType(p->conv, math_type(t)), "cudnnSetConvolutionMathType");
  return p;
}

// How x, y and the filter w are described to cuDNN.
ConvLayout layout_for(const Tensor& x, const Tensor& y, const Tensor& w) {
  const bool nhwc = nhwc_filter(w);
  return {detail::cudnn_activation_strides(x, nhwc), detail::cudnn_activation_strides(y, nhwc),
          nhwc};
}

// One plan per (geometry, layouts, dtype, device); plans are shared by all threads, the
// algorithm search runs under the lock once.
ConvPlan& plan_for(const Conv2dGeometry& g, const Tensor& x, const Tensor& y,
                   const ConvLayout& layout, std::unique_lock<std::mutex>& lock) {
  static std::mutex mutex;
  static std::map<PlanKey, std::unique_ptr<ConvPlan>> plans;
  lock = std::unique_lock<std::mutex>(mutex);
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  PlanKey key{conv_problem_key(g, layout), static_cast<int>(x.dtype()), device};
  auto& slot = plans[key];
  if (!slot) slot = make_plan(g, x.dtype(), x, y, layout);
  return *slot;
}

// The graph API first (conv_graph.h); false when it does not take this problem.
bool ran_on_graph_api(ConvDirection direction, const Conv2dGeometry& g, const ConvLayout& layout,
                      const Tensor& x, const Tensor& w, const Tensor& y) {
  // The bias is the op's (ops_conv.cpp adds it in f32), never cuDNN's.
  DPAR_CHECK(!g.has_bias, "conv2d on CUDA: the kernel takes no bias; conv2d adds it");
  return conv_graph_enabled() && run_conv_graph(direction, g, layout, x, w, y);
}

constexpr int kMaxAlgos = 16;
// Workspace the search may use per candidate; larger candidates are skipped.
constexpr size_t kSearchWorkspace = size_t{1} << 30;

// Runs the search once per plan and direction (`find` fills up to kMaxAlgos results, fastest
// first), keeps the fastest that succeeded, and sets its math type on the descriptor for the
// call that follows. The search's 1 GiB workspace is given back so it does not stay in the
// step's peak memory.
template <class Perf, class Algo, class Find>
void use_best_algo(ConvPlan& p, ChosenAlgo<Algo>& chosen, const char* what, Find find) {
  if (!chosen.chosen) {
    Perf results[kMaxAlgos];
    int count = 0;
    find(results, &count, workspace(kSearchWorkspace));
    const Perf* best = nullptr;
    for (int i = 0; i < count && !best; ++i) {
      if (results[i].status == CUDNN_STATUS_SUCCESS) best = &results[i];
    }
    if (!best) DPAR_FAIL("conv2d on CUDA: cuDNN found no algorithm for ", what);
    chosen = {true, best->algo, best->memory, best->mathType};
    // DPAR_CUDNN_LOG_ALGOS=1: one line per search, to see where a step's convolution time goes.
    if (log_cudnn_choices()) {
      std::fprintf(
          stderr, "cudnn: %s, %s: algo %d, %.3f ms, workspace %.1f MB, math %d (%d found)\n",
          p.description.c_str(), what, static_cast<int>(best->algo), best->time,
          static_cast<double>(best->memory) / 1048576.0, static_cast<int>(best->mathType), count);
    }
    release_workspace();
  }
  check_cudnn(cudnnSetConvolutionMathType(p.conv, chosen.math), "cudnnSetConvolutionMathType");
}

// ---- pointwise convolutions as GEMMs ------------------------------------------------------
// A 1x1 convolution with stride 1, no padding and one group over channels-last activations is
// a matrix product over the same memory: y[N*H*W, O] = x[N*H*W, C] W[O, C]^T, and its gradients
// are dx = dy W and dW = dy^T x. MobileNetV3's expand and project convolutions are all of this
// kind, and cuBLAS runs them on tensor cores; cuDNN's legacy-API algorithms took ~1 ms for such
// a weight gradient in f16/bf16 against 0.1 ms in f32 (H100, batch 128). DPAR_CONV_GEMM=0 sends
// them to cuDNN like the others.
bool conv_gemm_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DPAR_CONV_GEMM");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

bool pointwise_as_gemm(const Conv2dGeometry& g, const Tensor& activation, const Tensor& output,
                       const Tensor& filter) {
  return conv_gemm_enabled() && g.kH == 1 && g.kW == 1 && g.stride[0] == 1 && g.stride[1] == 1 &&
         g.padding[0] == 0 && g.padding[1] == 0 && g.groups == 1 &&
         activation.is_contiguous(MemoryFormat::ChannelsLast) &&
         output.is_contiguous(MemoryFormat::ChannelsLast) &&
         (filter.is_contiguous() || filter.is_contiguous(MemoryFormat::ChannelsLast));
}

// Channels-last [N,C,H,W] as the row-major matrix [N*H*W, C] over the same memory.
Tensor pixel_matrix(const Tensor& t) {
  return Tensor::from_storage(t.storage(), t.storage_offset(),
                              {t.size(0) * t.size(2) * t.size(3), t.size(1)}, {t.size(1), 1},
                              t.dtype());
}

// A 1x1 filter [O,C,1,1] (the same memory in both layouts) as the row-major matrix [O, C].
Tensor filter_matrix(const Tensor& w) {
  return Tensor::from_storage(w.storage(), w.storage_offset(), {w.size(0), w.size(1)},
                              {w.size(1), 1}, w.dtype());
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor c) {
  kernels::gemm.get(c.device())(a, trans_a, b, trans_b, Tensor(), c);
}

void conv2d_forward_cuda(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight,
                         const Tensor& /*bias: added by conv2d*/, Tensor& y, bool /*training*/) {
  DeviceGuard guard(x.device());
  if (pointwise_as_gemm(g, x, y, weight)) {
    return gemm(pixel_matrix(x), false, filter_matrix(weight), true, pixel_matrix(y));
  }
  const ConvLayout layout = layout_for(x, y, weight);
  if (ran_on_graph_api(ConvDirection::Forward, g, layout, x, weight, y)) return;
  std::unique_lock<std::mutex> lock;
  ConvPlan& p = plan_for(g, x, y, layout, lock);
  cudnnHandle_t h = cudnn_handle();
  use_best_algo<cudnnConvolutionFwdAlgoPerf_t>(
      p, p.fwd, "the forward pass", [&](auto* results, int* count, void* ws) {
        check_cudnn(cudnnFindConvolutionForwardAlgorithmEx(
                        h, p.x, x.raw_data(), p.w, weight.raw_data(), p.conv, p.y, y.raw_data(),
                        kMaxAlgos, count, results, ws, kSearchWorkspace),
                    "cudnnFindConvolutionForwardAlgorithmEx");
      });
  const float one = 1.f, zero = 0.f;
  check_cudnn(cudnnConvolutionForward(h, &one, p.x, x.raw_data(), p.w, weight.raw_data(), p.conv,
                                      p.fwd.algo, workspace(p.fwd.workspace), p.fwd.workspace,
                                      &zero, p.y, y.raw_data()),
              "cudnnConvolutionForward");
}

void conv2d_backward_data_cuda(const Conv2dGeometry& g, const Tensor& dy, const Tensor& weight,
                               Tensor& dx) {
  DeviceGuard guard(dy.device());
  if (pointwise_as_gemm(g, dx, dy, weight)) {
    return gemm(pixel_matrix(dy), false, filter_matrix(weight), false, pixel_matrix(dx));
  }
  const ConvLayout layout = layout_for(dx, dy, weight);
  if (ran_on_graph_api(ConvDirection::BackwardData, g, layout, dx, weight, dy)) return;
  std::unique_lock<std::mutex> lock;
  ConvPlan& p = plan_for(g, dx, dy, layout, lock);
  cudnnHandle_t h = cudnn_handle();
  use_best_algo<cudnnConvolutionBwdDataAlgoPerf_t>(
      p, p.bwd_data, "the input gradient", [&](auto* results, int* count, void* ws) {
        check_cudnn(cudnnFindConvolutionBackwardDataAlgorithmEx(
                        h, p.w, weight.raw_data(), p.y, dy.raw_data(), p.conv, p.x, dx.raw_data(),
                        kMaxAlgos, count, results, ws, kSearchWorkspace),
                    "cudnnFindConvolutionBackwardDataAlgorithmEx");
      });
  const float one = 1.f, zero = 0.f;
  check_cudnn(cudnnConvolutionBackwardData(h, &one, p.w, weight.raw_data(), p.y, dy.raw_data(),
                                           p.conv, p.bwd_data.algo, workspace(p.bwd_data.workspace),
                                           p.bwd_data.workspace, &zero, p.x, dx.raw_data()),
              "cudnnConvolutionBackwardData");
}

void conv2d_backward_weights_cuda(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                                  Tensor& dweight, Tensor& /*dbias: reduced by conv2d*/) {
  DeviceGuard guard(x.device());
  if (pointwise_as_gemm(g, x, dy, dweight)) {
    return gemm(pixel_matrix(dy), true, pixel_matrix(x), false, filter_matrix(dweight));
  }
  const ConvLayout layout = layout_for(x, dy, dweight);
  if (ran_on_graph_api(ConvDirection::BackwardFilter, g, layout, x, dweight, dy)) return;
  std::unique_lock<std::mutex> lock;
  ConvPlan& p = plan_for(g, x, dy, layout, lock);
  cudnnHandle_t h = cudnn_handle();
  use_best_algo<cudnnConvolutionBwdFilterAlgoPerf_t>(
      p, p.bwd_filter, "the weight gradient", [&](auto* results, int* count, void* ws) {
        check_cudnn(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        h, p.x, x.raw_data(), p.y, dy.raw_data(), p.conv, p.w, dweight.raw_data(),
                        kMaxAlgos, count, results, ws, kSearchWorkspace),
                    "cudnnFindConvolutionBackwardFilterAlgorithmEx");
      });
  const float one = 1.f, zero = 0.f;
  check_cudnn(
      cudnnConvolutionBackwardFilter(h, &one, p.x, x.raw_data(), p.y, dy.raw_data(), p.conv,
                                     p.bwd_filter.algo, workspace(p.bwd_filter.workspace),
                                     p.bwd_filter.workspace, &zero, p.w, dweight.raw_data()),
      "cudnnConvolutionBackwardFilter");
}

}  // namespace

void register_conv_kernels() {
  kernels::conv2d_forward.set(DeviceType::CUDA, &conv2d_forward_cuda);
  kernels::conv2d_backward_data.set(DeviceType::CUDA, &conv2d_backward_data_cuda);
  kernels::conv2d_backward_weights.set(DeviceType::CUDA, &conv2d_backward_weights_cuda);
}

}  // namespace dpar::cuda
