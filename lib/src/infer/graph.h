#pragma once
// The inference runtime's internal forms of a model:
//   Graph   - the ONNX file as read (nodes, attributes, initializers, metadata), without
//             protobuf types, so only onnx_loader.cpp sees the ONNX headers;
//   Program - the graph lowered to the handful of operations the planner executes, after
//             validation, removal of no-op nodes and BatchNormalization folding. Values are
//             numbered; shapes are left to the planner because the batch size is dynamic.
#include <array>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <set>
#include <string>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::infer::detail {

struct Attribute {
  enum class Type { Int, Float, String, Ints, Floats, Other };
  Type type = Type::Other;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
};

struct Node {
  std::string op;                    // op type; "domain:op" outside the default domain
  std::string name;                  // node name, or "#<index>" when the file gives none
  std::vector<std::string> inputs;   // "" marks an optional input that is left out
  std::vector<std::string> outputs;  // outputs[0] exists and is named (load_onnx checks)
  std::map<std::string, Attribute> attrs;

  bool has(const std::string& key) const { return attrs.count(key) != 0; }
  int64_t get_int(const std::string& key, int64_t def) const;
  float get_float(const std::string& key, float def) const;
  std::vector<int64_t> get_ints(const std::string& key, std::vector<int64_t> def) const;
  std::string get_string(const std::string& key, std::string def) const;
  // "Conv 'name'" for messages.
  std::string label() const;
};

struct GraphValue {
  std::string name;
  Shape dims;             // -1: dynamic
  int32_t elem_type = 0;  // ONNX TensorProto data type (1 = float)
};

// An INT8 or UINT8 initializer (quantized weights, zero points): the raw bytes in a u8 tensor.
struct QuantizedConstant {
  Tensor bytes;
  bool is_signed = true;  // INT8 (two's complement bytes), else UINT8
  float at(int64_t i) const {
    const uint8_t b = bytes.data<uint8_t>()[i];
    return is_signed ? static_cast<float>(static_cast<int8_t>(b)) : static_cast<float>(b);
  }
};

struct Graph {
  std::string path;
  std::string name;
  std::string producer;
  int64_t ir_version = 0;
  int64_t opset = 0;  // of the default domain
  std::vector<Node> nodes;
  std::map<std::string, Tensor> initializers;          // f32 or i64 constants, incl. Constant nodes
  std::map<std::string, std::string> other_constants;  // name -> dtype, for types we do not read
  std::map<std::string, QuantizedConstant> quantized;  // INT8/UINT8 (also in other_constants)
  std::vector<GraphValue> inputs;                      // graph inputs that are not initializers
  std::vector<std::string> outputs;
  std::map<std::string, std::string> metadata;
};

// Parses an ONNX file. Throws dpar::Error for unreadable, truncated or non-ONNX files.
Graph load_onnx(const std::string& path);

// One oneDNN eltwise operation; an ONNX activation lowers to one or two of these
// (HardSigmoid = linear then clip).
struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0;
  float beta = 0;
};

// The QuantizeLinear -> DequantizeLinear structure of a QDQ model (qdq.cpp): which values
// Conv/Gemm nodes read quantized. Zero points are always 0 (anything else is rejected).
struct QdqActivation {
  std::string x;  // the f32 value that is quantized
  float scale = 0;
  bool is_unsigned = false;  // uint8, else int8
};
struct QdqWeight {
  Tensor values;              // f32 holding the integers, the initializer's shape
  std::vector<float> scales;  // one (per tensor) or one per slice along axis
  int64_t axis = 1;
  bool is_unsigned = false;
};
struct Qdq {
  std::map<std::string, QdqActivation> activations;  // by DequantizeLinear output
  std::map<std::string, QdqWeight> weights;          // by DequantizeLinear output
};
// Checks that every QuantizeLinear/DequantizeLinear pair feeds a Conv or Gemm (data input:
// activation pair; weight input: DequantizeLinear of an int8 initializer), with zero points 0
// and both inputs of the node quantized. Throws dpar::Error naming the offending node.
Qdq resolve_qdq(const Graph& graph);

enum class OpKind { Conv, Gemm, Eltwise, Binary, GlobalAvgPool, Flatten, Softmax };

struct Op {
  OpKind kind;
  std::vector<std::string> nodes;  // labels of the ONNX nodes this op stands for
  int src = -1;
  int src2 = -1;  // Binary: the second operand
  int dst = -1;
  // Conv: weight [O,C/g,kH,kW]; Gemm: weight [O,K]. bias [O] or undefined.
  Tensor weight;
  Tensor bias;
  int64_t groups = 1;
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> dilation{1, 1};
  std::array<int64_t, 4> pads{0, 0, 0, 0};  // top, left, bottom, right
  std::string auto_pad = "NOTSET";
  std::vector<Eltwise> acts;  // Eltwise
  dnnl::algorithm binary_alg = dnnl::algorithm::binary_add;
  int64_t axis = 1;                // Flatten, Softmax
  bool softmax_coerce_2d = false;  // opset < 13: softmax over the flattened tail
  // Conv/Gemm in int8: weight then is a u8 tensor of s8 bytes ([O,K] for Gemm) and bias is
  // divided by src_scale * w_scales[o], because oneDNN 2.x adds the bias before the output
  // scales: dst = post_ops(src_scale * w_scale[o] * (acc + bias')).
  struct Int8 {
    bool on = false;
    // Quantized in the model but computed in f32 on its dequantized input and weights (a
    // depthwise Conv without VNNI: lower.cpp, make_int8); on is false then.
    bool f32 = false;
    float src_scale = 0;
    bool src_unsigned = false;    // u8, else s8; zero point 0
    std::vector<float> w_scales;  // per output channel, or one
    // u8 source without VNNI: weight and bias halved, w_scales doubled (lower.cpp, make_int8).
    bool halved = false;
  } int8;
};

struct Program {
  std::string path;
  std::vector<std::string> value_names;
  std::vector<Tensor> constants;  // by value id; defined for initializer operands
  int input = -1;
  int output = -1;
  Shape input_dims;  // declared, -1 = dynamic
  std::vector<Op> ops;
};

// The ops the oneDNN planner runs (the rest go to the node-by-node interpreter).
const std::set<std::string>& planner_ops();

// Validates the graph and lowers it. Throws one dpar::Error per problem class, listing every
// instance (all unsupported ops, all missing tensors).
Program lower(const Graph& graph);

// The shape of every value for one input shape (constants keep theirs; 0-d becomes [1]) and
// each op's convolution padding with auto_pad resolved. Throws dpar::Error naming the node
// whose shapes do not fit.
struct Shapes {
  std::vector<Shape> dims;                        // by value id
  std::vector<std::array<int64_t, 4>> conv_pads;  // by op: top, left, bottom, right
};
Shapes infer_shapes(const Program& program, const Shape& input_dims);

}  // namespace dpar::infer::detail
