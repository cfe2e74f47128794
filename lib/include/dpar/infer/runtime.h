#pragma once
// dpar::infer: runs an exported ONNX image classifier (MobileNetV3 and similar CNNs) on the CPU
// with oneDNN. Loading validates the whole graph up front (unsupported ops, missing
// initializers, bad attributes) and folds BatchNormalization into the preceding convolution.
// The first run() at a given input shape builds an execution plan for it: convolutions and
// inner products with their activations and residual additions fused as oneDNN post-ops,
// weights reordered once into the layout the primitive prefers, and activation buffers
// preallocated and reused along the graph. Later runs at that shape only execute primitives.
//
//   auto model = dpar::infer::Model::load("out/inference.onnx");
//   model.set_num_threads(1);
//   dpar::Tensor probs = model.run(images);  // [N,3,224,224] -> [N,classes]
//
// Supported ONNX ops (default domain): Conv, BatchNormalization, Gemm, Relu, LeakyRelu,
// HardSwish, HardSigmoid, Sigmoid, Tanh, Clip, Add, Mul, GlobalAveragePool, Flatten, Softmax,
// Identity, Dropout (inference: a no-op) and Constant.
//
// Graphs with other ops - transformers such as the exported ViT: MatMul, LayerNormalization,
// Reshape, Transpose, Gather, Pad (zeros), Erf, Sub, Div, Sqrt, MaxPool, AveragePool beside the
// ops above - run node by node on dpar's tensor ops instead (fused attention and layer norm
// kernels on the CPU; also on a GPU with set_device), f32 only; plan_summary() then lists the
// nodes.
//
// QDQ (int8) models, as export_model --precision int8 writes them: a Conv or Gemm whose data
// input comes through QuantizeLinear -> DequantizeLinear and whose weight is an int8
// initializer through DequantizeLinear runs as a oneDNN int8 primitive (u8/s8 source, s8
// weights, per-tensor or per-output-channel scales, zero points 0), with its activations and
// residual addition fused and, when the next layers read its result in int8, writing u8/s8
// directly (requantisation). Other ops run in f32 between quantize reorders. A Q/DQ pair on
// the input of any other op is an error naming that node: dpar has no int8 kernel for it.
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::infer {

// What the file says about the model. Exporters (dpar's export_onnx among them) store the
// preprocessing in metadata_props:
//   model_name   "mobilenet_v3_small"
//   input_layout "NCHW" (an image), or "tensor" (any other input: input_shape "-1,65,192"
//                gives its dims, and there is no image preprocessing)
//   input_size   "224" (square side), "3,224,192" (C,H,W) or "dynamic"
//   resize_size  "256" (shorter side before the centre crop)
//   mean, std    "0.485,0.456,0.406" (per channel, on [0,1] pixels)
//   class_names  "a,b,c", a JSON array of strings, or names separated by newlines
// Missing entries fall back to the graph (name, input shape) and ImageNet statistics.
struct ModelInfo {
  std::string path;
  std::string name;      // model_name, else the graph name, else the file's stem
  std::string producer;  // "pytorch 1.13.1", "dpar 0.1.0", ...
  int64_t ir_version = 0;
  int64_t opset = 0;
  std::string input_name;
  std::string output_name;
  Shape input_shape;         // as declared; -1 marks a dynamic dimension
  bool image_input = true;   // false for input_layout "tensor" (a sequence model's features)
  int64_t input_height = 0;  // from metadata or a static input shape; 0 if unknown
  int64_t input_width = 0;
  int64_t resize_size = 0;  // from metadata; 0 if unknown
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
  std::vector<std::string> class_names;         // empty when the file has none
  bool outputs_probabilities = false;           // the graph ends in Softmax
  std::string precision = "fp32";               // "int8": a QDQ model, its Conv/Gemm run in int8
  std::map<std::string, std::string> metadata;  // every metadata_props entry
  int64_t num_nodes = 0;                        // ONNX nodes in the file
};

class Model {
 public:
  // Reads and validates an ONNX file; throws dpar::Error naming the file and what is wrong.
  static Model load(const std::string& path);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const ModelInfo& info() const;

  // input: f32 CPU tensor of the declared rank (any layout); dimensions the file fixes must
  // match. Returns the graph output as a new contiguous tensor. Calls on one Model are
  // serialised (they share the plan's buffers); use one Model per thread for parallel runs.
  Tensor run(const Tensor& input);

  // Builds (or fetches) the plan for input_shape without running it, e.g. before timing.
  void prepare(const Shape& input_shape);

  // One line per executed step of the plan for input_shape (builds it if needed): the oneDNN
  // implementation, output shape, and the ONNX nodes fused into it.
  std::vector<std::string> plan_summary(const Shape& input_shape);

  // Where run() computes: the CPU (the oneDNN plan, the default) or a CUDA device, where the
  // lowered graph runs on dpar's CUDA ops (cuDNN convolutions, cuBLAS Gemm; weights copied
  // there once, convolution weights channels-last). On a GPU run() takes a CPU or device input
  // and returns the output on the device; fp32 models only (an int8 model is an error naming
  // its first int8 op), symmetric convolution padding only. Throws dpar::Error naming the
  // device when it cannot be used.
  // compute f16 or bf16 (GPU only): convolutions and Gemm run in that dtype under
  // amp::Autocast, the rest in f32 (infer --precision fp16).
  void set_device(Device device, DType compute = DType::f32);
  DType compute_dtype() const;
  Device device() const;

  // Intra-op threads for this model's runs (0: the process default, see dpar::set_num_threads).
  void set_num_threads(int n);
  int num_threads() const;

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The oneDNN library version the runtime executes on, e.g. "2.6.3".
std::string onednn_version();

}  // namespace dpar::infer
