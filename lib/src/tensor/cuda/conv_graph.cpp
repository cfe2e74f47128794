// Convolutions through cuDNN's graph (backend) API: see conv_graph.h. Every descriptor call goes
// through Desc, which owns the descriptor; a problem no engine supports is remembered as such and
// left to the legacy API.
#include "tensor/cuda/conv_graph.h"

#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/cuda_libraries.h"

namespace dpar::cuda {
namespace {

using kernels::Conv2dGeometry;

// On unless the variable is "0" (DPAR_CUDNN_BENCHMARK, DPAR_CUDNN_RUNTIME_COMPILED).
bool env_unless_zero(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v) != "0";
}

// Owns one backend descriptor. Setters throw dpar::Error naming the attribute; the search
// catches that per candidate engine and per problem.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check_cudnn(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& other) noexcept : d_(other.d_) { other.d_ = nullptr; }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc& operator=(Desc&& other) noexcept {
    std::swap(d_, other.d_);
    return *this;
  }

  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const T* values) {
    check_cudnn(cudnnBackendSetAttribute(d_, name, type, count, values),
                attribute_what(name).c_str());
    return *this;
  }
  Desc& set_descriptor(cudnnBackendAttributeName_t name, const Desc& value) {
    const cudnnBackendDescriptor_t d = value.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }
  Desc& finalize(const char* what) {
    check_cudnn(cudnnBackendFinalize(d_), what);
    return *this;
  }

 private:
  static std::string attribute_what(cudnnBackendAttributeName_t name) {
    return "cudnnBackendSetAttribute(attribute " + std::to_string(static_cast<int>(name)) + ")";
  }
  cudnnBackendDescriptor_t d_ = nullptr;
};

// The largest power of two up to 16 that divides the address: cuDNN's vectorised kernels need
// to be told, and a plan chosen for aligned buffers must not run on an unaligned view.
int64_t byte_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int64_t alignment = 16;
  while (alignment > 1 && address % static_cast<uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

constexpr int64_t kUidX = 'x', kUidW = 'w', kUidY = 'y';

Desc tensor_desc(int64_t uid, DType t, const std::array<int64_t, 4>& dims,
                 const std::array<int64_t, 4>& strides, int64_t alignment) {
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t type = cudnn_data_type(t);
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment)
      .finalize("cudnnBackendFinalize(tensor)");
  return d;
}

Desc convolution_desc(const Conv2dGeometry& g) {
  Desc d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t dilation[2] = {g.dilation[0], g.dilation[1]};
  const int64_t stride[2] = {g.stride[0], g.stride[1]};
  const int64_t padding[2] = {g.padding[0], g.padding[1]};
  d.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding)
      .finalize("cudnnBackendFinalize(convolution)");
  return d;
}

// The descriptor type and attribute names of one direction's operation, for its input x,
// filter w, output-side y (forward: y; backward data: dx, w, dy; backward filter: x, dw, dy).
struct OperationAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  const char* what;
};

const OperationAttributes& operation_attributes(ConvDirection direction) {
  static const OperationAttributes forward{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                           "cudnnBackendFinalize(convolution forward)"};
  static const OperationAttributes backward_data{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
      "cudnnBackendFinalize(convolution backward data)"};
  static const OperationAttributes backward_filter{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
      "cudnnBackendFinalize(convolution backward filter)"};
  switch (direction) {
    case ConvDirection::Forward:
      return forward;
    case ConvDirection::BackwardData:
      return backward_data;
    case ConvDirection::BackwardFilter:
      return backward_filter;
  }
  DPAR_FAIL("conv2d on CUDA: unknown direction");
}

// The operation of one direction over the three tensors. Groups are implied by the filter's
// second dimension (C / groups), as in PyTorch's graph-API convolutions.
Desc operation_desc(ConvDirection direction, const Desc& x, const Desc& w, const Desc& y,
                    const Desc& conv) {
  const OperationAttributes& a = operation_attributes(direction);
  const float alpha = 1.f, beta = 0.f;
  Desc op(a.type);
  op.set_descriptor(a.x, x)
      .set_descriptor(a.w, w)
      .set_descriptor(a.y, y)
      .set_descriptor(a.conv, conv)
      .set(a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(a.beta, CUDNN_TYPE_FLOAT, 1, &beta)
      .finalize(a.what);
  return op;
}

// The engine configurations one heuristics mode offers for the graph, best guess first.
std::vector<Desc> engine_configs(const Desc& graph, cudnnBackendHeurMode_t mode) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)
      .finalize("cudnnBackendFinalize(engine heuristics)");
  int64_t count = 0;
  check_cudnn(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
              "cudnnBackendGetAttribute(heuristics result count)");
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  if (count > 0) {
    check_cudnn(
        cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()),
        "cudnnBackendGetAttribute(heuristics results)");
  }
  configs.erase(configs.begin() + std::min(returned, count), configs.end());
  return configs;
}

enum class EngineKind { Refused, Precompiled, RuntimeCompiled };

// The engine behind an engine configuration; false where cuDNN does not say.
bool engine_of(const Desc& config, Desc& engine) {
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  return cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                  &raw) == CUDNN_STATUS_SUCCESS;
}

// An engine's numerical notes (how its arithmetic departs from a plain f32 convolution).
bool numerical_notes(const Desc& engine, std::vector<cudnnBackendNumericalNote_t>& out) {
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                               CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                               notes) != CUDNN_STATUS_SUCCESS)
    return false;
  out.assign(notes, notes + n);
  return true;
}

// "fft,winograd": the notes DPAR_CUDNN_LOG_ALGOS prints beside a chosen engine.
std::string describe_notes(const Desc& config) {
  static const char* const names[CUDNN_NUMERICAL_NOTE_TYPE_COUNT] = {
      "tensor-core",  "down-convert",     "reduced-precision-reduction",
      "fft",          "nondeterministic", "winograd",
      "winograd-4x4", "winograd-6x6",     "winograd-13x13",
      "strict-nan"};
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::vector<cudnnBackendNumericalNote_t> notes;
  if (!engine_of(config, engine) || !numerical_notes(engine, notes)) return "?";
  std::string text;
  for (cudnnBackendNumericalNote_t note : notes) {
    if (note < 0 || note >= CUDNN_NUMERICAL_NOTE_TYPE_COUNT) continue;
    if (!text.empty()) text += ',';
    text += names[note];
  }
  return text.empty() ? "none" : text;
}

// Engines the search leaves out, as PyTorch's filter does: ones that convert inputs to a
// narrower type, and TF32 tensor cores for f32 (dpar keeps f32 exact unless DPAR_ALLOW_TF32=1).
// Engines compiled at run time (NVRTC) are told apart: they cost a compilation per problem.
EngineKind engine_kind(const Desc& config, DType t, bool allow_tf32) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::vector<cudnnBackendNumericalNote_t> notes;
  if (!engine_of(config, engine) || !numerical_notes(engine, notes)) return EngineKind::Refused;
  for (cudnnBackendNumericalNote_t note : notes) {
    if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return EngineKind::Refused;
    if (t == DType::f32 && !allow_tf32 && note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
      return EngineKind::Refused;
  }
  cudnnBackendBehaviorNote_t behaviour[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                               CUDNN_TYPE_BEHAVIOR_NOTE, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n,
                               behaviour) != CUDNN_STATUS_SUCCESS)
    return EngineKind::Refused;
  for (int64_t i = 0; i < n; ++i) {
    if (behaviour[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return EngineKind::RuntimeCompiled;
  }
  return EngineKind::Precompiled;
}

int64_t engine_index(const Desc& config) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0, index = -1;
  if (engine_of(config, engine))
    cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                             &index);
  return index;
}

// One execution: a variant pack naming the three buffers and the workspace.
cudnnStatus_t execute(cudnnHandle_t handle, const Desc& plan, void* x, void* w, void* y, void* ws) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* pointers[3] = {x, w, y};
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers)
      .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)
      .finalize("cudnnBackendFinalize(variant pack)");
  return cudnnBackendExecute(handle, plan.get(), pack.get());
}

// A problem's verdict: the fastest engine's plan, or none (legacy API).
struct GraphPlan {
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
};

// Candidates timed per problem (PyTorch's torch.backends.cudnn.benchmark_limit is 10), and the
// most workspace one may take: workspace counts in the step's peak memory.
constexpr size_t kMaxCandidates = 12;
constexpr int64_t kMaxWorkspace = int64_t{64} << 20;
// Engines compiled at run time (NVRTC) are tried only where a kernel specialised to the shape
// can pay for its compilation (H100, batch 128, f32: the precompiled depthwise engines take
// 0.15-0.4 ms where PyTorch's step runs ~0.035 ms kernels): for problems of at least this many
// activation elements, at most two of them. DPAR_CUDNN_RUNTIME_COMPILED=0 leaves them out.
constexpr int64_t kRuntimeCompiledMinElements = int64_t{1} << 20;
constexpr size_t kMaxRuntimeCompiled = 2;

// Whether the candidate (ms, workspace) should replace the best so far: more workspace must buy
// at least 10% of time, less workspace is worth up to 10%.
bool better(float ms, int64_t ws, float best_ms, int64_t best_ws) {
  if (ws == best_ws) return ms < best_ms;
  return ws < best_ws ? ms < best_ms * 1.1f : ms < best_ms * 0.9f;
}

const char* direction_name(ConvDirection d) {
  switch (d) {
    case ConvDirection::Forward:
      return "the forward pass";
    case ConvDirection::BackwardData:
      return "the input gradient";
    case ConvDirection::BackwardFilter:
      return "the weight gradient";
  }
  return "?";
}

// Builds the graph, times every allowed engine on the real buffers and keeps the fastest.
// each_engine (sweep_conv_engines): called after each engine's first run, its output in place.
GraphPlan search(ConvDirection direction, const Conv2dGeometry& g, const ConvLayout& layout,
                 const Tensor& x, const Tensor& w, const Tensor& y,
                 const EngineVisitor* each_engine = nullptr) {
  const auto search_start = std::chrono::steady_clock::now();
  const DType t = x.dtype();
  const std::string description = describe_conv(g, t, layout);
  const int64_t cg = g.C / g.groups;
  const std::array<int64_t, 4> w_strides =
      layout.nhwc_filter ? std::array<int64_t, 4>{g.kH * g.kW * cg, 1, g.kW * cg, cg}
                         : std::array<int64_t, 4>{cg * g.kH * g.kW, g.kH * g.kW, g.kW, 1};
  const Desc xd =
      tensor_desc(kUidX, t, {g.N, g.C, g.H, g.W}, layout.x_strides, byte_alignment(x.raw_data()));
  const Desc wd =
      tensor_desc(kUidW, t, {g.O, cg, g.kH, g.kW}, w_strides, byte_alignment(w.raw_data()));
  const Desc yd =
      tensor_desc(kUidY, t, {g.N, g.O, g.OH, g.OW}, layout.y_strides, byte_alignment(y.raw_data()));
  const Desc conv = convolution_desc(g);
  const Desc op = operation_desc(direction, xd, wd, yd, conv);
  cudnnHandle_t handle = cudnn_handle();
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const cudnnBackendDescriptor_t ops[1] = {op.get()};
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops)
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .finalize("cudnnBackendFinalize(operation graph)");

  const bool allow_tf32 = tf32_allowed();
  static const bool runtime_compiled = env_unless_zero("DPAR_CUDNN_RUNTIME_COMPILED");
  const size_t max_runtime_compiled =
      runtime_compiled && std::max(x.numel(), y.numel()) >= kRuntimeCompiledMinElements
          ? kMaxRuntimeCompiled
          : 0;
  std::vector<Desc> candidates;
  size_t precompiled = 0, compiled = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_INSTANT, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<Desc> configs;
    try {
      configs = engine_configs(graph, mode);
    } catch (const Error&) {
      continue;  // a mode with nothing for this graph
    }
    for (Desc& c : configs) {
      const EngineKind kind = engine_kind(c, t, allow_tf32);
      size_t& taken = kind == EngineKind::RuntimeCompiled ? compiled : precompiled;
      const size_t limit =
          kind == EngineKind::RuntimeCompiled ? max_runtime_compiled : kMaxCandidates;
      if (kind != EngineKind::Refused && taken < limit) {
        ++taken;
        candidates.push_back(std::move(c));
      }
    }
  }

  cudaStream_t stream = current_stream();
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  GraphPlan best;
  float best_ms = 0;
  int64_t best_engine = -1;
  std::string best_notes;
  int timed = 0;
  const bool benchmark = cudnn_benchmark() || each_engine != nullptr;  // a sweep visits all
  for (Desc& config : candidates) {
    auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    int64_t ws_size = 0, n = 0;
    try {
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
          .set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config)
          .finalize("cudnnBackendFinalize(execution plan)");
      check_cudnn(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &n, &ws_size),
                  "cudnnBackendGetAttribute(workspace size)");
    } catch (const Error&) {
      continue;  // this engine does not support the problem
    }
    if (ws_size > kMaxWorkspace) continue;
    void* ws = workspace(static_cast<size_t>(ws_size));
    // One untimed run (first-use costs, and a refusal at execution), then the mean of three.
    if (execute(handle, *plan, x.raw_data(), w.raw_data(), y.raw_data(), ws) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    if (each_engine) (*each_engine)(engine_index(config), describe_notes(config));
    float ms = 0;  // untimed (heuristics' order): the first engine that runs is kept
    if (benchmark) {
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      bool ok = true;
      for (int i = 0; i < 3 && ok; ++i)
        ok = execute(handle, *plan, x.raw_data(), w.raw_data(), y.raw_data(), ws) ==
             CUDNN_STATUS_SUCCESS;
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      if (!ok) continue;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      ms /= 3;
      ++timed;
    }
    if (!best.plan || better(ms, ws_size, best_ms, best.workspace)) {
      best_ms = ms;
      best_engine = engine_index(config);
      if (log_cudnn_choices()) best_notes = describe_notes(config);
      best.plan = std::move(plan);
      best.workspace = ws_size;
    }
    if (!benchmark) break;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // The search's workspaces go back to the pool, so they do not stay in the step's peak.
  release_workspace();
  // Errors a refused candidate left behind must not be reported by the next kernel's check.
  cudaGetLastError();
  if (log_cudnn_choices()) {
    if (best.plan) {
      const double search_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - search_start)
              .count();
      std::fprintf(stderr,
                   "cudnn graph: %s, %s: engine %lld (notes %s), %.3f ms, workspace %.1f MB "
                   "(%d of %zu engines timed, %zu compiled at run time; search %.0f ms)\n",
                   description.c_str(), direction_name(direction),
                   static_cast<long long>(best_engine), best_notes.c_str(), best_ms,
                   static_cast<double>(best.workspace) / 1048576.0, timed, candidates.size(),
                   compiled, search_ms);
    } else {
      std::fprintf(stderr, "cudnn graph: %s, %s: no engine of %zu ran; the legacy API takes it\n",
                   description.c_str(), direction_name(direction), candidates.size());
    }
  }
  return best;
}

}  // namespace

namespace {
bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && *v != '0';
}
}  // namespace

bool tf32_allowed() {
  static const bool allowed = env_flag("DPAR_ALLOW_TF32");
  return allowed;
}

bool cudnn_benchmark() {
  static const bool on = env_unless_zero("DPAR_CUDNN_BENCHMARK");
  return on;
}

bool log_cudnn_choices() {
  static const bool log = env_flag("DPAR_CUDNN_LOG_ALGOS");
  return log;
}

std::vector<int64_t> conv_problem_key(const Conv2dGeometry& g, const ConvLayout& layout) {
  std::vector<int64_t> key = {g.N,
                              g.C,
                              g.H,
                              g.W,
                              g.O,
                              g.kH,
                              g.kW,
                              g.OH,
                              g.OW,
                              g.stride[0],
                              g.stride[1],
                              g.padding[0],
                              g.padding[1],
                              g.dilation[0],
                              g.dilation[1],
                              g.groups,
                              layout.nhwc_filter};
  key.insert(key.end(), layout.x_strides.begin(), layout.x_strides.end());
  key.insert(key.end(), layout.y_strides.begin(), layout.y_strides.end());
  return key;
}

std::string describe_conv(const Conv2dGeometry& g, DType t, const ConvLayout& layout) {
  return std::string(dtype_name(t)) + " [" + std::to_string(g.N) + "," + std::to_string(g.C) + "," +
         std::to_string(g.H) + "," + std::to_string(g.W) + "] -> " + std::to_string(g.O) + " k" +
         std::to_string(g.kH) + "x" + std::to_string(g.kW) + " s" + std::to_string(g.stride[0]) +
         " g" + std::to_string(g.groups) + (layout.x_strides[1] == 1 ? " nhwc" : " nchw") +
         (layout.nhwc_filter ? " filter nhwc" : " filter nchw");
}

bool conv_graph_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DPAR_CUDNN_API");
    return v == nullptr || std::string(v) != "legacy";
  }();
  return enabled;
}

namespace {

using PlanKey = std::tuple<int, std::vector<int64_t>, int, int>;

std::mutex& plans_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Lives for the process: execution plans hold device resources the driver may already have
// dropped when static destructors run.
std::map<PlanKey, GraphPlan>& plans() {
  static auto* plans = new std::map<PlanKey, GraphPlan>();
  return *plans;
}

}  // namespace

ConvGraphCounts conv_graph_counts() {
  std::lock_guard<std::mutex> lock(plans_mutex());
  ConvGraphCounts counts;
  for (const auto& [key, plan] : plans()) ++(plan.plan ? counts.on_graph : counts.on_legacy);
  return counts;
}

void sweep_conv_engines(ConvDirection direction, const Conv2dGeometry& g, const ConvLayout& layout,
                        const Tensor& x, const Tensor& w, const Tensor& y,
                        const EngineVisitor& each_engine) {
  // Beside run_conv_graph's cache: the plan found here is dropped.
  search(direction, g, layout, x, w, y, &each_engine);
}

bool run_conv_graph(ConvDirection direction, const Conv2dGeometry& g, const ConvLayout& layout,
                    const Tensor& x, const Tensor& w, const Tensor& y) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  std::vector<int64_t> values = conv_problem_key(g, layout);
  for (const void* p : {x.raw_data(), w.raw_data(), y.raw_data()})
    values.push_back(byte_alignment(p));
  PlanKey key{static_cast<int>(direction), std::move(values), static_cast<int>(x.dtype()), device};
  std::lock_guard<std::mutex> lock(plans_mutex());
  auto found = plans().find(key);
  if (found == plans().end()) {
    GraphPlan plan;
    try {
      plan = search(direction, g, layout, x, w, y);
    } catch (const Error& e) {
      // The graph itself was refused (a cuDNN without these descriptors, or a layout it does
      // not take): the legacy API runs this problem from now on.
      if (log_cudnn_choices())
        std::fprintf(stderr, "cudnn graph: %s, %s: %s; the legacy API takes it\n",
                     describe_conv(g, x.dtype(), layout).c_str(), direction_name(direction),
                     e.what());
      cudaGetLastError();
    }
    found = plans().emplace(std::move(key), std::move(plan)).first;
  }
  const GraphPlan& plan = found->second;
  if (!plan.plan) return false;
  check_cudnn(execute(cudnn_handle(), *plan.plan, x.raw_data(), w.raw_data(), y.raw_data(),
                      workspace(static_cast<size_t>(plan.workspace))),
              "cudnnBackendExecute(convolution)");
  return true;
}

}  // namespace dpar::cuda
