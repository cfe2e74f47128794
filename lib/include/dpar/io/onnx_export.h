#pragma once
// Export of a trained module to ONNX for inference.
//
// The module tree is lowered into a small graph IR (OnnxGraph: nodes in topological order plus
// f32 constants) by per-module-type lowerings: the built-in nn layers come with dpar, a model
// with its own composite modules (a custom forward) registers lowerings for them. Graph
// passes then fold each BatchNormalization into the Conv that feeds it, and the result is
// written as an ONNX ModelProto (opset 14, IR version 7; opset 17 and IR version 8 when the
// graph has LayerNormalization), validated by ONNX's checker and
// strict shape inference before anything reaches the disk.
//
//   io::OnnxLowerings lowerings;                      // Conv2d, BatchNorm2d, Linear, ...
//   lowerings.add<MyBlock>([](const nn::Module& m, const std::string& x,
//                             io::OnnxGraphBuilder& b) {
//     const auto& blk = static_cast<const MyBlock&>(m);
//     const std::string y = b.lower(*blk.conv, "conv", x);   // children by their names
//     return b.add_node("Add", {y, x});
//   });
//   io::export_onnx(model, "out/inference", {.model_name = "my_model"}, lowerings);
//
// Export has eval semantics: BatchNorm uses its running statistics and Dropout is omitted.
// The ONNX types stay inside libdpar; this header only speaks dpar.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dpar/nn/layers.h"
#include "dpar/nn/module.h"
#include "dpar/tensor/tensor.h"

namespace dpar::io {

// An ONNX attribute value: INT, FLOAT, INTS or STRING.
using OnnxAttribute = std::variant<int64_t, float, std::vector<int64_t>, std::string>;
using OnnxAttributes = std::vector<std::pair<std::string, OnnxAttribute>>;

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;  // as in safetensors.h

struct OnnxNode {
  std::string op_type;              // "Conv", "Relu", ... (default ONNX domain)
  std::string name;                 // unique: "<module path>/<op_type>"
  std::vector<std::string> inputs;  // value names: the graph input, initializers, node outputs
  std::string output;               // every op used by the exporter has one output
  OnnxAttributes attributes;

  // The attribute called name, or nullptr.
  const OnnxAttribute* attribute(const std::string& name) const;
};

// The exporter's IR. Value names are unique strings; nodes are in topological order.
struct OnnxGraph {
  std::string input;   // the graph input's value name
  std::string output;  // the value the graph returns
  std::vector<OnnxNode> nodes;
  NamedTensors initializers;  // contiguous f32 CPU tensors, in creation order
  // Initializers written as 8-bit integers (int8 quantization): name -> "int8" or "uint8". The
  // f32 tensors in `initializers` hold the integer values.
  std::map<std::string, std::string> quantized_initializers;

  const Tensor* initializer(const std::string& name) const;  // nullptr if not a constant
  std::vector<const OnnxNode*> consumers(const std::string& value) const;
};

class OnnxLowerings;

// Handed to each lowering. Keeps the module path (state-dict style, "features.1.block.0") that
// names the nodes and constants a lowering adds, so the exported graph reads like the model.
class OnnxGraphBuilder {
 public:
  OnnxGraphBuilder(OnnxGraph& graph, const OnnxLowerings& lowerings);

  // Lowers a child of the module being lowered; name is the child's registered name (its
  // path becomes "<path>.<name>"). Returns the child's output value.
  std::string lower(const nn::Module& child, const std::string& name, const std::string& input);
  // Lowers module at the current path (the root, or a module the caller names itself).
  std::string lower_here(const nn::Module& module, const std::string& input);

  // Appends a node "<path>/<op_type>" (suffixed _1, _2, ... if taken); returns its output.
  std::string add_node(const std::string& op_type, std::vector<std::string> inputs,
                       OnnxAttributes attributes = {});
  // Adds a constant "<path>.<name>" holding an f32 copy of value; returns its value name.
  std::string add_initializer(const std::string& name, const Tensor& value);
  // An int64 constant (shapes for Reshape, indices for Gather, pads) of the given shape ({}
  // for a scalar); not counted as a parameter.
  std::string add_int64_initializer(const std::string& name, std::vector<int64_t> values,
                                    const Shape& shape);

  const std::string& path() const { return path_; }
  // The path as error messages show it: "<root>" for the module being exported itself.
  std::string display_path() const { return path_.empty() ? "<root>" : path_; }
  OnnxGraph& graph() { return graph_; }

 private:
  std::string unique_value_name(const std::string& base);

  OnnxGraph& graph_;
  const OnnxLowerings& lowerings_;
  std::string path_;
  std::map<std::string, int> used_names_;
};

// How module types become graph nodes. The default set covers dpar::nn's layers:
// Sequential (children in order, including subclasses), Conv2d -> Conv, BatchNorm2d ->
// BatchNormalization, Linear -> Gemm (2-D input), ReLU -> Relu, Hardswish -> HardSwish,
// Hardsigmoid -> HardSigmoid (alpha 1/6, beta 1/2 as torch), AdaptiveAvgPool2d(1) ->
// GlobalAveragePool, Flatten(1, -1) -> Flatten, Dropout and Identity -> nothing; LayerNorm ->
// LayerNormalization (the file is then opset 17), GELU -> its formula (Div, Erf, Add, Mul; or
// the tanh form), Tanh, Sigmoid, SiLU -> Sigmoid and Mul, LeakyReLU, MaxPool2d -> MaxPool,
// AvgPool2d -> AveragePool, MultiheadAttention (self-attention, batch- or sequence-first) ->
// MatMul, Reshape, Transpose, Gather, Softmax; TransformerEncoderLayer (post- or pre-norm,
// ReLU or GELU) -> those, its Linears as MatMul and Add, LayerNormalization.
class OnnxLowerings {
 public:
  // Returns the output value of the module's computation on input.
  using Lowering = std::function<std::string(const nn::Module& module, const std::string& input,
                                             OnnxGraphBuilder& builder)>;
  using Matcher = std::function<bool(const nn::Module& module)>;

  OnnxLowerings();  // with the built-in layers

  // For modules of type M or derived from it. Later registrations win over earlier ones
  // (and over the built-ins), so a model can override how a layer is exported.
  template <class M>
  void add(Lowering fn) {
    add_matching([](const nn::Module& m) { return dynamic_cast<const M*>(&m) != nullptr; },
                 std::move(fn));
  }
  void add_matching(Matcher matches, Lowering fn);

  // The lowering for module, or nullptr when none matches.
  const Lowering* find(const nn::Module& module) const;

 private:
  std::vector<std::pair<Matcher, Lowering>> entries_;
};

// Linear as MatMul with the transposed weight (+ Add bias), for inputs of any rank ([N, S, in]
// in a transformer); the built-in Linear lowering is Gemm, which takes 2-D input only.
std::string lower_linear_matmul(const nn::Linear& fc, const std::string& name,
                                const std::string& input, OnnxGraphBuilder& builder);
// Registers the lowerings listed above beyond the CNN set (OnnxLowerings() calls it).
void add_sequence_model_lowerings(OnnxLowerings& lowerings);

// The model's metadata_props (all strings), for runtimes and tools:
//   model_name, framework ("dpar"), dpar_version, dpar_commit,
//   input_name, input_layout ("NCHW"), input_size ("224" square, "3,H,W", or "dynamic"),
//   color_format ("RGB"), pixel_scale (1/255), mean, std ("0.485,0.456,0.406"), resize_size
//   (for a non-image input_shape: input_layout "tensor" and input_shape instead),
//   output_name, softmax ("true"/"false"), num_classes, class_names ("a,b,c" or JSON array).
// inference.json holds the same facts as JSON (input_shape with -1 for dynamic dimensions).
struct OnnxExportOptions {
  std::string model_name = "model";  // graph name and metadata "model_name"
  // Input [batch, channels, height, width]; height/width 0 make those dimensions dynamic
  // ("height", "width"). The batch dimension is dynamic ("batch") unless fixed_batch > 0.
  int64_t channels = 3;
  int64_t height = 224;
  int64_t width = 224;
  int64_t fixed_batch = 0;
  // A model whose input is not an image (a sequence model on [N, S, E] or [S, N, E]
  // features): the input's whole shape, 0 for a dynamic dimension ("dim0", "dim1", ...).
  // Non-empty, it replaces channels/height/width/fixed_batch, and the metadata records no image
  // preprocessing: input_layout "tensor" and input_shape ("-1,16,32"; -1 dynamic) instead of
  // input_size, color_format, pixel_scale, mean, std and resize_size; inference.json's
  // "preprocess" is null.
  std::vector<int64_t> input_shape;
  std::string input_name = "x";
  std::string output_name;  // empty: "probs" with softmax, "logits" without
  bool softmax = true;      // append Softmax over the classes (PaddlePaddle's export default)
  bool fold_batch_norm = true;
  // Preprocessing the model expects, recorded in the metadata: RGB pixels scaled to [0,1],
  // resized so the shorter side is resize_size (0: height * 256 / 224), centre-cropped to
  // height x width, then (x - mean) / std per channel.
  std::vector<float> mean{0.485f, 0.456f, 0.406f};
  std::vector<float> std{0.229f, 0.224f, 0.225f};
  int64_t resize_size = 0;
  // Empty, or one per output class. Stored comma-joined ("a,b,c"), or as a JSON array when a
  // name contains ',' or a newline.
  std::vector<std::string> class_names;
  std::map<std::string, std::string> metadata;  // extra metadata_props (override the above)
  bool write_json = true;  // also write inference.json with the preprocessing facts
  // Runs on the graph after BatchNorm folding, before serialization (e.g. io::quantize_qdq).
  std::function<void(OnnxGraph&)> graph_pass;
};

struct OnnxExportResult {
  std::string model_path;  // <dir>/inference.onnx
  std::string json_path;   // <dir>/inference.json, or empty
  int64_t num_nodes = 0;
  int64_t num_classes = 0;  // the output's last dimension (from shape inference)
  int64_t num_parameters = 0;
  int64_t folded_batch_norms = 0;
  std::map<std::string, int64_t> op_counts;  // op type -> nodes
  std::map<std::string, std::string> metadata;
};

// The module tree as an OnnxGraph (before any pass), with options' input/output names.
// Throws a dpar::Error naming the module path and type of a module no lowering handles.
OnnxGraph lower_to_onnx(const nn::Module& module, const OnnxExportOptions& options,
                        const OnnxLowerings& lowerings = OnnxLowerings());

// Folds every BatchNormalization fed by a Conv (whose output nothing else reads, with
// constant weights used by that Conv only) into the Conv: w' = w * g / sqrt(var + eps),
// b' = (b - mean) * g / sqrt(var + eps) + beta, computed in double. Returns how many folded;
// others stay as BatchNormalization nodes. Drops constants nothing uses any more.
int64_t fold_batch_norms(OnnxGraph& graph);

// The serialized, checked ModelProto (graph passes already applied by the caller), and what
// export_onnx reports about it.
std::string serialize_onnx(const OnnxGraph& graph, const OnnxExportOptions& options,
                           OnnxExportResult* info = nullptr);

// lower_to_onnx + fold_batch_norms (if enabled) + serialize_onnx, then writes
// <dir>/inference.onnx (and inference.json). dir is created if missing. Both files are
// written to temporary names, fsynced and renamed only when both are complete, so on any
// error the previous export in dir is left as it was.
OnnxExportResult export_onnx(const nn::Module& module, const std::string& dir,
                             const OnnxExportOptions& options,
                             const OnnxLowerings& lowerings = OnnxLowerings());

}  // namespace dpar::io
