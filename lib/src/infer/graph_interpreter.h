#pragma once
// Runs an ONNX graph node by node with dpar's tensor ops: the path for models outside the
// oneDNN planner's CNN set (transformers: MatMul, LayerNormalization, Reshape, Transpose,
// Gather, Pad, Erf, ...), on the CPU or a CUDA device. Every node is checked when the
// interpreter is built (unsupported ops all listed at once; the constant inputs that shapes,
// pads and indices need); shapes are checked as the ops run.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "infer/graph.h"

namespace dpar::infer::detail {

// The ops the interpreter runs (default domain), each with how many inputs it requires.
const std::map<std::string, size_t>& interpreter_ops();

class GraphInterpreter {
 public:
  // Throws dpar::Error listing every unsupported op, or naming a node whose attributes or
  // constant inputs it cannot use.
  explicit GraphInterpreter(const Graph& graph);

  // input: f32 of the graph input's rank; the result is on device().
  Tensor run(const Tensor& input) const;
  void to(Device device);  // copies the constants there
  Device device() const { return device_; }
  // One line per node: "<op> '<name>'".
  std::vector<std::string> summary() const;
  bool ends_in_softmax() const;

 private:
  Tensor eval(const Node& node, const std::vector<Tensor>& in) const;

  std::string path_;
  std::vector<Node> nodes_;
  std::string input_, output_;
  std::map<std::string, Tensor> constants_;  // f32 and i64 initializers, on device_
  Device device_ = Device::cpu();
};

}  // namespace dpar::infer::detail
