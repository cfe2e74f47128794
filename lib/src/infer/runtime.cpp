// dpar::infer::Model: loading (parse, validate, lower), metadata, and the per-shape plan cache.
#include "dpar/infer/runtime.h"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "infer/graph.h"
#include "infer/graph_interpreter.h"
#include "infer/op_executor.h"
#include "infer/plan.h"
#include "infer/plan_util.h"

namespace dpar::infer {

using detail::Plan;
using detail::Program;
using detail::ThreadScope;

struct Model::Impl {
  ModelInfo info;
  Program program;
  detail::WeightCache weights;
  std::map<std::pair<Shape, int>, std::unique_ptr<Plan>> plans;  // (input shape, threads)
  std::mutex mutex;
  int threads = 0;
  std::unique_ptr<detail::OpExecutor> on_device;  // set_device(cuda:N); null on the CPU
  // Graphs outside the planner's CNN set (transformers) run node by node on dpar's ops.
  std::unique_ptr<detail::GraphInterpreter> interpreter;

  // Call with mutex held and the thread count in effect.
  Plan& plan_for(const Shape& shape) {
    const auto key = std::make_pair(shape, omp_get_max_threads());
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    // Plans hold buffers sized for their batch; a caller cycling through many shapes should
    // not accumulate them without bound.
    if (plans.size() >= 16) plans.clear();
    auto plan = std::make_unique<Plan>(program, weights, shape);
    return *plans.emplace(key, std::move(plan)).first->second;
  }

  void check_input(const Tensor& x) const {
    DPAR_CHECK(x.defined(), info.path, ": run() got an undefined tensor");
    const Device where = interpreter ? interpreter->device()
                         : on_device ? on_device->device()
                                     : Device::cpu();
    DPAR_CHECK(x.device().is_cpu() || x.device() == where, info.path, ": the model runs on ",
               where.str(), ", got an input on ", x.device().str());
    DPAR_CHECK(x.dtype() == DType::f32, info.path, ": expected a float32 input, got ",
               dtype_name(x.dtype()));
    check_shape(x.shape());
  }

  void check_shape(const Shape& shape) const {
    for (int64_t d : shape) DPAR_CHECK(d > 0, info.path, ": empty input ", shape);
    const Shape& want = program.input_dims;
    if (want.empty()) return;
    bool ok = shape.size() == want.size();
    for (size_t d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == shape[d];
    std::string expected = "[";
    for (size_t d = 0; d < want.size(); ++d) {
      if (d) expected.append(",");
      expected.append(want[d] >= 0 ? std::to_string(want[d]) : d == 0 ? "N" : "?");
    }
    DPAR_CHECK(ok, info.path, ": the model expects input ", expected, "], got ", shape);
  }
};

namespace {

std::vector<float> parse_floats(const std::string& path, const std::string& key, std::string text) {
  for (char& c : text) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream in(text);
  std::vector<float> out;
  float v;
  while (in >> v) out.push_back(v);
  DPAR_CHECK(in.eof() && !out.empty(), path, ": metadata '", key, "' = '", text,
             "' is not a list of numbers");
  return out;
}

std::array<float, 3> three(const std::string& path, const std::string& key,
                           const std::string& text) {
  const std::vector<float> v = parse_floats(path, key, text);
  DPAR_CHECK(v.size() == 1 || v.size() == 3, path, ": metadata '", key, "' = '", text,
             "' should have 1 or 3 values");
  return v.size() == 3 ? std::array<float, 3>{v[0], v[1], v[2]}
                       : std::array<float, 3>{v[0], v[0], v[0]};
}

std::vector<std::string> parse_names(const std::string& path, const std::string& text) {
  std::vector<std::string> names;
  if (!text.empty() && text.front() == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      DPAR_FAIL(path, ": metadata 'class_names' is not valid JSON: ", e.what());
    }
    DPAR_CHECK(j.is_array(), path, ": metadata 'class_names' should be a JSON array");
    for (const auto& item : j)
      names.push_back(item.is_string() ? item.get<std::string>() : item.dump());
    return names;
  }
  const char sep = text.find('\n') != std::string::npos ? '\n' : ',';
  std::istringstream in(text);
  for (std::string name; std::getline(in, name, sep);) names.push_back(name);
  return names;
}

ModelInfo make_info(const detail::Graph& g, const Program& p) {
  ModelInfo info;
  info.path = g.path;
  info.producer = g.producer;
  info.ir_version = g.ir_version;
  info.opset = g.opset;
  info.input_name = g.inputs[0].name;
  info.output_name = g.outputs[0];
  info.input_shape = p.input_dims;
  info.metadata = g.metadata;
  info.num_nodes = static_cast<int64_t>(g.nodes.size());
  auto meta = [&](std::initializer_list<const char*> keys) -> const std::string* {
    for (const char* k : keys) {
      auto it = g.metadata.find(k);
      if (it != g.metadata.end() && !it->second.empty()) return &it->second;
    }
    return nullptr;
  };
  // Exporters name graphs generically ("torch_jit", "main_graph"); the file name says more.
  const bool generic = g.name.empty() || g.name == "torch_jit" || g.name == "main_graph";
  if (const std::string* name = meta({"model_name", "name"})) {
    info.name = *name;
  } else {
    info.name = generic ? std::filesystem::path(g.path).stem().string() : g.name;
  }
  if (const std::string* layout = meta({"input_layout"})) info.image_input = *layout != "tensor";
  if (p.input_dims.size() == 4 && p.input_dims[2] > 0 && p.input_dims[3] > 0) {
    info.input_height = p.input_dims[2];
    info.input_width = p.input_dims[3];
  }
  const std::string* size = meta({"input_size"});
  if (size && *size != "dynamic") {
    const std::vector<float> v = parse_floats(g.path, "input_size", *size);
    info.input_height = static_cast<int64_t>(v.size() >= 2 ? v[v.size() - 2] : v[0]);
    info.input_width = static_cast<int64_t>(v.back());
  }
  if (const std::string* resize = meta({"resize_size"})) {
    info.resize_size = static_cast<int64_t>(parse_floats(g.path, "resize_size", *resize)[0]);
  }
  if (const std::string* mean = meta({"mean", "normalize_mean"})) {
    info.mean = three(g.path, "mean", *mean);
  }
  if (const std::string* std = meta({"std", "normalize_std"})) {
    info.std = three(g.path, "std", *std);
  }
  if (const std::string* names = meta({"class_names", "labels"})) {
    info.class_names = parse_names(g.path, *names);
  }
  for (const auto& op : p.ops) {
    if (op.dst == p.output) info.outputs_probabilities = op.kind == detail::OpKind::Softmax;
    if (op.int8.on || op.int8.f32) info.precision = "int8";
  }
  return info;
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  const detail::Graph graph = detail::load_onnx(path);
  try {
    impl->program = detail::lower(graph);
  } catch (const Error&) {
    // Not a graph the oneDNN planner takes: the interpreter runs it when it knows every op;
    // otherwise the planner's error (which lists what it cannot run) stands.
    const bool interpretable = std::all_of(
        graph.nodes.begin(), graph.nodes.end(),
        [](const detail::Node& n) { return detail::interpreter_ops().count(n.op) != 0; });
    if (!interpretable) throw;
    impl->interpreter = std::make_unique<detail::GraphInterpreter>(graph);
    impl->program.path = graph.path;
    impl->program.input_dims = graph.inputs[0].dims;
    impl->info = make_info(graph, impl->program);
    impl->info.outputs_probabilities = impl->interpreter->ends_in_softmax();
    return Model(std::move(impl));
  }
  // When the file fixes every dimension but the batch, shape errors surface at load.
  Shape probe = impl->program.input_dims;
  if (!probe.empty() && probe[0] < 0) probe[0] = 1;
  if (!probe.empty() && std::all_of(probe.begin(), probe.end(), [](int64_t d) { return d > 0; })) {
    detail::infer_shapes(impl->program, probe);
  }
  impl->info = make_info(graph, impl->program);
  return Model(std::move(impl));
}

const ModelInfo& Model::info() const { return impl_->info; }

Tensor Model::run(const Tensor& input) {
  impl_->check_input(input);
  if (impl_->interpreter) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ThreadScope threads(impl_->threads);
    return impl_->interpreter->run(input);
  }
  if (impl_->on_device) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    return impl_->on_device->run(input);
  }
  const Tensor x = input.is_contiguous() ? input : input.contiguous();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  ThreadScope threads(impl_->threads);
  return impl_->plan_for(x.shape()).run(x);
}

void Model::prepare(const Shape& input_shape) {
  impl_->check_shape(input_shape);
  if (impl_->interpreter) return;  // nothing to plan
  std::lock_guard<std::mutex> lock(impl_->mutex);
  ThreadScope threads(impl_->threads);
  impl_->plan_for(input_shape);
}

std::vector<std::string> Model::plan_summary(const Shape& input_shape) {
  impl_->check_shape(input_shape);
  if (impl_->interpreter) return impl_->interpreter->summary();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  ThreadScope threads(impl_->threads);
  return impl_->plan_for(input_shape).summary();
}

void Model::set_device(Device device, DType compute) {
  check_device_available(device);
  DPAR_CHECK(compute == DType::f32 || compute == DType::f16 || compute == DType::bf16,
             "infer::Model::set_device: compute dtype ", dtype_name(compute),
             " is not f32, f16 or bf16");
  DPAR_CHECK(compute == DType::f32 || device.is_cuda(), impl_->info.path, ": ", dtype_name(compute),
             " inference runs on a GPU, not on ", device.str());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->interpreter) {
    DPAR_CHECK(compute == DType::f32, impl_->info.path,
               ": this model runs on the node-by-node path, which computes in f32");
    impl_->interpreter->to(device);
    return;
  }
  impl_->on_device = device.is_cpu()
                         ? nullptr
                         : std::make_unique<detail::OpExecutor>(impl_->program, device, compute);
}

DType Model::compute_dtype() const {
  return impl_->on_device ? impl_->on_device->compute() : DType::f32;
}

Device Model::device() const {
  if (impl_->interpreter) return impl_->interpreter->device();
  return impl_->on_device ? impl_->on_device->device() : Device::cpu();
}

void Model::set_num_threads(int n) {
  DPAR_CHECK(n >= 0, "infer::Model::set_num_threads: expected >= 0 (0 = process default), got ", n);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->threads = n;
}

int Model::num_threads() const {
  return impl_->threads > 0 ? impl_->threads : omp_get_max_threads();
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace dpar::infer
