#pragma once
// Convolutions through cuDNN's graph (backend) API, as PyTorch runs them: one operation graph per
// problem, the engines cuDNN's heuristics and fallback list offer, each timed once on the real
// buffers (cudnn.benchmark = True), the fastest kept as an execution plan. These engines include
// the NHWC depthwise and direct kernels the legacy API never selects (H100, batch 128: 0.2-0.5 ms
// per depthwise forward through the legacy API against ~0.035 ms in PyTorch's step).
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dpar/tensor/tensor.h"
#include "tensor/nn_kernels.h"

namespace dpar::cuda {

enum class ConvDirection { Forward, BackwardData, BackwardFilter };

// How the three operands of a convolution are described to cuDNN: activation strides (see
// detail::cudnn_activation_strides) and the filter's layout.
struct ConvLayout {
  std::array<int64_t, 4> x_strides{}, y_strides{};
  bool nhwc_filter = false;
};

// Shared by both cuDNN paths (conv.cpp, conv_graph.cpp):
bool tf32_allowed();       // DPAR_ALLOW_TF32=1
bool log_cudnn_choices();  // DPAR_CUDNN_LOG_ALGOS=1
// DPAR_CUDNN_BENCHMARK=0 (cudnn.benchmark = False): the graph API takes the first engine in
// cuDNN's heuristic order that runs, untimed, so the choice, and with it the rounding, is the
// same in every run on a given GPU and cuDNN. Timed (the default), the fastest engine can differ
// from run to run where timings are close or the GPU is shared, and engines differ in rounding.
bool cudnn_benchmark();
// Geometry and the strides cuDNN is given: the part of a plan cache's key both paths share.
std::vector<int64_t> conv_problem_key(const kernels::Conv2dGeometry& g, const ConvLayout& layout);

// "f32 [N,C,H,W] -> O kHxkW sS gG nhwc filter nhwc": how DPAR_CUDNN_LOG_ALGOS names a problem.
std::string describe_conv(const kernels::Conv2dGeometry& g, DType t, const ConvLayout& layout);

// Whether convolutions go through the graph API (the default; DPAR_CUDNN_API=legacy keeps the
// legacy descriptor API for all of them).
bool conv_graph_enabled();

// Runs one convolution direction through the graph API: x [N,C,H,W], w [O,C/groups,kH,kW],
// y [N,O,OH,OW]; the direction's output (y, x or w) is overwritten. Returns false, having run
// nothing, when no graph-API engine supports the problem (the caller then uses the legacy API);
// the verdict is cached per problem.
bool run_conv_graph(ConvDirection direction, const kernels::Conv2dGeometry& g,
                    const ConvLayout& layout, const Tensor& x, const Tensor& w, const Tensor& y);

// For tests that hold every engine to a reference: runs the search's candidates for one problem
// as run_conv_graph would (same filter, heuristics' order), calling each_engine(engine index,
// numerical notes) after each engine that ran, with its result in the direction's output
// (read it on the current stream); the plans are not kept.
using EngineVisitor = std::function<void(int64_t engine, const std::string& notes)>;
void sweep_conv_engines(ConvDirection direction, const kernels::Conv2dGeometry& g,
                        const ConvLayout& layout, const Tensor& x, const Tensor& w, const Tensor& y,
                        const EngineVisitor& each_engine);

// Problems seen so far (each direction of each shape counts once): how many the graph API runs
// and how many it left to the legacy API. For tests and DPAR_CUDNN_LOG_ALGOS readers.
struct ConvGraphCounts {
  int64_t on_graph = 0, on_legacy = 0;
};
ConvGraphCounts conv_graph_counts();

}  // namespace dpar::cuda
