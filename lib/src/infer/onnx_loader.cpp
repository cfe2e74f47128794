// Reads an ONNX file with the ONNX protobuf API (Debian's libonnx-dev) into detail::Graph.
// Everything that can be wrong with the bytes themselves is caught here, with the file named:
// unreadable, empty, truncated or not ONNX, initializers whose data does not match their shape.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "infer/graph.h"

namespace dpar::infer::detail {

namespace {

namespace fs = std::filesystem;

std::string data_type_name(int32_t type) {
  const auto* desc = onnx::TensorProto_DataType_descriptor();
  const auto* value = desc->FindValueByNumber(type);
  return value ? value->name() : "type " + std::to_string(type);
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  DPAR_CHECK(fs::exists(path, ec), path, ": no such file");
  DPAR_CHECK(!fs::is_directory(path, ec), path, ": is a directory, expected an .onnx file");
  std::ifstream in(path, std::ios::binary);
  DPAR_CHECK(in.good(), path, ": cannot open for reading");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  DPAR_CHECK(!in.bad(), path, ": read error");
  return bytes.str();
}

// The data of an initializer stored in a separate file (ONNX "external data").
std::string read_external(const onnx::TensorProto& t, const std::string& model_path,
                          size_t nbytes) {
  std::string location;
  int64_t offset = 0;
  int64_t length = -1;
  const auto number = [&](const std::string& key, const std::string& text) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    DPAR_CHECK(ec == std::errc() && end == text.data() + text.size() && v >= 0, model_path,
               ": initializer '", t.name(), "' has external ", key, " '", text,
               "', not a non-negative integer");
    return v;
  };
  for (const auto& entry : t.external_data()) {
    if (entry.key() == "location") location = entry.value();
    if (entry.key() == "offset") offset = number("offset", entry.value());
    if (entry.key() == "length") length = number("length", entry.value());
  }
  DPAR_CHECK(!location.empty(), model_path, ": initializer '", t.name(),
             "' is stored externally but names no location");
  // As the ONNX checker: external data lives beside the model, never elsewhere on the machine.
  const fs::path rel(location);
  bool escapes = rel.is_absolute();
  for (const auto& part : rel) escapes = escapes || part == "..";
  DPAR_CHECK(!escapes, model_path, ": initializer '", t.name(), "' is stored at '", location,
             "', outside the model's folder");
  const std::string file = (fs::path(model_path).parent_path() / rel).string();
  std::ifstream in(file, std::ios::binary);
  DPAR_CHECK(in.good(), model_path, ": initializer '", t.name(), "' is stored in ", file,
             ", which cannot be opened");
  DPAR_CHECK(length < 0 || static_cast<size_t>(length) == nbytes, model_path, ": initializer '",
             t.name(), "' has external length ", length, ", its shape needs ", nbytes, " bytes");
  // The file must hold the bytes before any are allocated: a shape claims what it likes.
  std::error_code ec;
  const uintmax_t size = fs::file_size(file, ec);
  DPAR_CHECK(!ec && static_cast<uintmax_t>(offset) <= size && nbytes <= size - offset, model_path,
             ": initializer '", t.name(), "': ", file, " ends before offset ", offset, " + ",
             nbytes, " bytes");
  std::string data(nbytes, '\0');
  in.seekg(offset);
  in.read(data.data(), static_cast<std::streamsize>(nbytes));
  DPAR_CHECK(in.gcount() == static_cast<std::streamsize>(nbytes), model_path, ": initializer '",
             t.name(), "': ", file, " ends before offset ", offset, " + ", nbytes, " bytes");
  return data;
}

// Booleans (Dropout's training_mode) as an i64 tensor of 0/1: one byte each in raw or
// external data, else int32_data.
Tensor read_bool(const onnx::TensorProto& t, const Shape& dims, int64_t numel,
                 const std::string& path) {
  const size_t n = static_cast<size_t>(numel);
  std::vector<int64_t> values;
  if (t.data_location() == onnx::TensorProto::EXTERNAL || !t.raw_data().empty()) {
    const std::string data =
        t.data_location() == onnx::TensorProto::EXTERNAL ? read_external(t, path, n) : t.raw_data();
    DPAR_CHECK(data.size() == n, path, ": initializer '", t.name(), "' holds ", data.size(),
               " bytes, its shape ", dims, " needs ", n);
    values.resize(n);
    for (size_t i = 0; i < n; ++i) values[i] = data[i] != 0;
  } else {
    DPAR_CHECK(t.int32_data_size() == numel, path, ": initializer '", t.name(), "' holds ",
               t.int32_data_size(), " values, its shape ", dims, " needs ", numel);
    values.resize(n);
    for (size_t i = 0; i < n; ++i) values[i] = t.int32_data(static_cast<int>(i)) != 0;
  }
  return Tensor::from_vector(values, dims);
}

// An initializer's shape, checked to be one a file can hold; numel receives its element count.
Shape checked_dims(const onnx::TensorProto& t, const std::string& path, int64_t& numel) {
  Shape dims(t.dims().begin(), t.dims().end());
  numel = 1;
  int64_t span = 1;
  for (int64_t d : dims) {
    DPAR_CHECK(d >= 0 && d <= (int64_t{1} << 40), path, ": initializer '", t.name(),
               "' has a bad shape ", dims);
    // Checked multiply: two plausible dimensions can still overflow (found by fuzz_onnx_model).
    // Zero-sized dimensions count as 1 here: an empty tensor's strides are the product of the
    // other dimensions and must fit too (also found by fuzz_onnx_model).
    const bool overflow = __builtin_mul_overflow(span, std::max<int64_t>(d, 1), &span);
    DPAR_CHECK(!overflow && span <= (int64_t{1} << 40), path, ": initializer '", t.name(),
               "' is implausibly large: ", dims);
    numel *= d;
  }
  return dims;
}

// f32, i64 and bool tensors become dpar Tensors; the caller records other types by name.
Tensor read_tensor(const onnx::TensorProto& t, const std::string& path) {
  int64_t numel = 0;
  const Shape dims = checked_dims(t, path, numel);
  if (t.data_type() == onnx::TensorProto::BOOL) return read_bool(t, dims, numel, path);
  const bool is_float = t.data_type() == onnx::TensorProto::FLOAT;
  const size_t elem = is_float ? sizeof(float) : sizeof(int64_t);
  const size_t nbytes = static_cast<size_t>(numel) * elem;
  // The tensor is allocated only once the file has shown it holds the bytes.
  const auto filled = [&](const void* bytes) {
    Tensor out = Tensor::empty(dims, is_float ? DType::f32 : DType::i64);
    if (nbytes) std::memcpy(out.raw_data(), bytes, nbytes);
    return out;
  };
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    return filled(read_external(t, path, nbytes).data());
  }
  if (!t.raw_data().empty()) {
    DPAR_CHECK(t.raw_data().size() == nbytes, path, ": initializer '", t.name(), "' holds ",
               t.raw_data().size(), " bytes, its shape ", dims, " needs ", nbytes,
               " (truncated or corrupt file?)");
    return filled(t.raw_data().data());
  }
  if (is_float) {
    DPAR_CHECK(t.float_data_size() == numel, path, ": initializer '", t.name(), "' holds ",
               t.float_data_size(), " values, its shape ", dims, " needs ", numel);
    return filled(t.float_data().data());
  }
  DPAR_CHECK(t.int64_data_size() == numel, path, ": initializer '", t.name(), "' holds ",
             t.int64_data_size(), " values, its shape ", dims, " needs ", numel);
  return filled(t.int64_data().data());
}

// INT8/UINT8 initializers: one byte each in raw or external data, else one value per
// int32_data entry.
QuantizedConstant read_int8(const onnx::TensorProto& t, const std::string& path) {
  int64_t numel = 0;
  const Shape dims = checked_dims(t, path, numel);
  QuantizedConstant q;
  q.is_signed = t.data_type() == onnx::TensorProto::INT8;
  const size_t n = static_cast<size_t>(numel);
  if (t.data_location() == onnx::TensorProto::EXTERNAL || !t.raw_data().empty()) {
    const std::string data =
        t.data_location() == onnx::TensorProto::EXTERNAL ? read_external(t, path, n) : t.raw_data();
    DPAR_CHECK(data.size() == n, path, ": initializer '", t.name(), "' holds ", data.size(),
               " bytes, its shape ", dims, " needs ", n, " (truncated or corrupt file?)");
    q.bytes = Tensor::empty(dims, DType::u8);
    if (n) std::memcpy(q.bytes.data<uint8_t>(), data.data(), n);
  } else {
    DPAR_CHECK(t.int32_data_size() == numel, path, ": initializer '", t.name(), "' holds ",
               t.int32_data_size(), " values, its shape ", dims, " needs ", numel);
    q.bytes = Tensor::empty(dims, DType::u8);
    uint8_t* out = q.bytes.data<uint8_t>();
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(t.int32_data(static_cast<int>(i)));
  }
  return q;
}

bool readable_type(int32_t type) {
  return type == onnx::TensorProto::FLOAT || type == onnx::TensorProto::INT64 ||
         type == onnx::TensorProto::BOOL;
}

Attribute read_attribute(const onnx::AttributeProto& a) {
  Attribute out;
  switch (a.type()) {
    case onnx::AttributeProto::INT:
      out.type = Attribute::Type::Int;
      out.i = a.i();
      break;
    case onnx::AttributeProto::FLOAT:
      out.type = Attribute::Type::Float;
      out.f = a.f();
      break;
    case onnx::AttributeProto::STRING:
      out.type = Attribute::Type::String;
      out.s = a.s();
      break;
    case onnx::AttributeProto::INTS:
      out.type = Attribute::Type::Ints;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case onnx::AttributeProto::FLOATS:
      out.type = Attribute::Type::Floats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    default:
      break;
  }
  return out;
}

// A Constant node's value as an initializer.
Tensor constant_value(const onnx::NodeProto& node, const std::string& label,
                      const std::string& path) {
  for (const auto& a : node.attribute()) {
    if (a.name() == "value" && a.type() == onnx::AttributeProto::TENSOR) {
      DPAR_CHECK(readable_type(a.t().data_type()), path, ": ", label, " holds a ",
                 data_type_name(a.t().data_type()),
                 " tensor; only FLOAT, INT64 and BOOL are supported");
      return read_tensor(a.t(), path);
    }
    if (a.name() == "value_float") return Tensor::full({}, a.f());
    if (a.name() == "value_floats") {
      return Tensor::from_vector(std::vector<float>(a.floats().begin(), a.floats().end()),
                                 {a.floats_size()});
    }
    if (a.name() == "value_int") return Tensor::from_vector(std::vector<int64_t>{a.i()}, {});
    if (a.name() == "value_ints") {
      return Tensor::from_vector(std::vector<int64_t>(a.ints().begin(), a.ints().end()),
                                 {a.ints_size()});
    }
  }
  DPAR_FAIL(path, ": ", label, " has no tensor, float or int value (sparse and string ",
            "constants are not supported)");
}

GraphValue read_value_info(const onnx::ValueInfoProto& v) {
  GraphValue out;
  out.name = v.name();
  if (v.type().has_tensor_type()) {
    const auto& tt = v.type().tensor_type();
    out.elem_type = tt.elem_type();
    for (const auto& d : tt.shape().dim()) {
      out.dims.push_back(d.has_dim_value() && d.dim_value() > 0 ? d.dim_value() : -1);
    }
  }
  return out;
}

}  // namespace

Graph load_onnx(const std::string& path) {
  const std::string bytes = read_file(path);
  DPAR_CHECK(!bytes.empty(), path, ": empty file, expected an ONNX model");
  onnx::ModelProto model;
  DPAR_CHECK(model.ParseFromString(bytes), path,
             ": not a valid ONNX model (protobuf parsing failed: the file is truncated or "
             "corrupt)");
  DPAR_CHECK(model.ir_version() > 0 && model.has_graph() && model.graph().node_size() > 0, path,
             ": not an ONNX model (no IR version or an empty graph; truncated or not ONNX?)");

  Graph g;
  g.path = path;
  g.ir_version = model.ir_version();
  g.producer = model.producer_name();
  if (!model.producer_version().empty()) g.producer += " " + model.producer_version();
  for (const auto& op_set : model.opset_import()) {
    if (op_set.domain().empty() || op_set.domain() == "ai.onnx") g.opset = op_set.version();
  }
  DPAR_CHECK(g.opset > 0, path, ": the model imports no opset of the default ONNX domain");
  for (const auto& prop : model.metadata_props()) g.metadata[prop.key()] = prop.value();

  const onnx::GraphProto& graph = model.graph();
  g.name = graph.name();
  for (const auto& init : graph.initializer()) {
    if (init.data_type() == onnx::TensorProto::INT8 ||
        init.data_type() == onnx::TensorProto::UINT8) {
      g.quantized[init.name()] = read_int8(init, path);
      g.other_constants[init.name()] = data_type_name(init.data_type());
    } else if (readable_type(init.data_type())) {
      g.initializers[init.name()] = read_tensor(init, path);
    } else {
      g.other_constants[init.name()] = data_type_name(init.data_type());
    }
  }
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& n = graph.node(i);
    Node node;
    const bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
    node.op = default_domain ? n.op_type() : n.domain() + ":" + n.op_type();
    // (append, not "#" + to_string: GCC 12 warns falsely about that concatenation at -O3.)
    node.name = n.name();
    if (node.name.empty()) node.name.append("#").append(std::to_string(i));
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    // Every ONNX op writes at least its first output; both runtimes index it, so it is checked
    // once here (found by fuzz_onnx_model: a node without outputs reached std::vector::at).
    DPAR_CHECK(!node.outputs.empty() && !node.outputs[0].empty(), path, ": ", node.label(),
               " has no output");
    for (const auto& a : n.attribute()) node.attrs[a.name()] = read_attribute(a);
    if (node.op == "Constant" && node.outputs.size() == 1) {
      g.initializers[node.outputs[0]] = constant_value(n, node.label(), path);
      continue;
    }
    g.nodes.push_back(std::move(node));
  }
  for (const auto& in : graph.input()) {
    if (g.initializers.count(in.name()) || g.other_constants.count(in.name())) continue;
    g.inputs.push_back(read_value_info(in));
  }
  for (const auto& out : graph.output()) g.outputs.push_back(out.name());
  return g;
}

int64_t Node::get_int(const std::string& key, int64_t def) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return def;
  DPAR_CHECK(it->second.type == Attribute::Type::Int, label(), ": attribute ", key,
             " should be an int");
  return it->second.i;
}

float Node::get_float(const std::string& key, float def) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return def;
  DPAR_CHECK(it->second.type == Attribute::Type::Float, label(), ": attribute ", key,
             " should be a float");
  return it->second.f;
}

std::vector<int64_t> Node::get_ints(const std::string& key, std::vector<int64_t> def) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return def;
  DPAR_CHECK(it->second.type == Attribute::Type::Ints, label(), ": attribute ", key,
             " should be a list of ints");
  return it->second.ints;
}

std::string Node::get_string(const std::string& key, std::string def) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return def;
  DPAR_CHECK(it->second.type == Attribute::Type::String, label(), ": attribute ", key,
             " should be a string");
  return it->second.s;
}

std::string Node::label() const { return op + " '" + name + "'"; }

}  // namespace dpar::infer::detail
