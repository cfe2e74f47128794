// OnnxGraph -> ONNX ModelProto (Debian's libonnx, protobuf C++ API), validated by ONNX's
// strict shape inference and checker, then written atomically with its inference.json.
#include <fcntl.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dpar/core/error.h"
#include "dpar/core/version.h"
#include "dpar/io/onnx_export.h"

namespace dpar::io {

static_assert(std::endian::native == std::endian::little,
              "ONNX raw_data is little-endian; the exporter copies memory as is");

namespace {

namespace fs = std::filesystem;

// HardSwish entered the default domain in opset 14; IR version 7 is the one ONNX 1.9 paired
// with opset 14, so runtimes of that age and newer read the file.
constexpr int64_t kOpset = 14;
constexpr int64_t kIrVersion = 7;

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  s.erase(std::unique(s.begin(), s.end(), [](char a, char b) { return a == ' ' && b == ' '; }),
          s.end());
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string float_str(float v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  return std::string(buf, res.ptr);
}

std::string join_floats(const std::vector<float>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += float_str(v[i]);
  }
  return out;
}

void set_attribute(onnx::NodeProto& node, const std::string& name, const OnnxAttribute& value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  if (const auto* i = std::get_if<int64_t>(&value)) {
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(*i);
  } else if (const auto* f = std::get_if<float>(&value)) {
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(*f);
  } else if (const auto* ints = std::get_if<std::vector<int64_t>>(&value)) {
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : *ints) a->add_ints(x);
  } else {
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(std::get<std::string>(value));
  }
}

void set_dim(onnx::TensorShapeProto::Dimension* d, int64_t value, const std::string& symbol) {
  if (value > 0) {
    d->set_dim_value(value);
  } else {
    d->set_dim_param(symbol);
  }
}

bool image_input(const OnnxExportOptions& o) { return o.input_shape.empty(); }

// The input's dims with -1 for the dynamic ones.
std::vector<int64_t> declared_input_dims(const OnnxExportOptions& o) {
  std::vector<int64_t> dims;
  if (image_input(o)) {
    for (int64_t d : {o.fixed_batch, o.channels, o.height, o.width}) dims.push_back(d > 0 ? d : -1);
  } else {
    for (int64_t d : o.input_shape) dims.push_back(d > 0 ? d : -1);
  }
  return dims;
}

void check_options(const OnnxExportOptions& o) {
  DPAR_CHECK(!o.model_name.empty(), "export_onnx: the model name must not be empty");
  DPAR_CHECK(o.resize_size >= 0, "export_onnx: resize_size must be >= 0, got ", o.resize_size);
  if (!image_input(o)) {
    for (size_t i = 0; i < o.input_shape.size(); ++i) {
      DPAR_CHECK(o.input_shape[i] >= 0, "export_onnx: input_shape[", i, "] is ", o.input_shape[i],
                 " (the input's dims: sizes, or 0 for a dynamic one)");
    }
    return;
  }
  DPAR_CHECK(o.channels > 0 && o.height >= 0 && o.width >= 0 && o.fixed_batch >= 0,
             "export_onnx: bad input shape: channels ", o.channels, ", height ", o.height,
             ", width ", o.width, ", fixed batch ", o.fixed_batch);
  DPAR_CHECK(static_cast<int64_t>(o.mean.size()) == o.channels &&
                 static_cast<int64_t>(o.std.size()) == o.channels,
             "export_onnx: mean and std need ", o.channels, " values each, got ", o.mean.size(),
             " and ", o.std.size());
  for (float s : o.std) {
    DPAR_CHECK(s > 0.0f, "export_onnx: std values must be positive, got ", join_floats(o.std));
  }
}

// "a,b,c"; a JSON array when a name would not survive that (a ',' or newline in it, an empty
// name, or a leading '[' that readers take for JSON).
std::string class_names_text(const std::vector<std::string>& names) {
  const bool plain = std::all_of(names.begin(), names.end(), [](const std::string& n) {
    return !n.empty() && n.front() != '[' && n.find_first_of(",\n") == std::string::npos;
  });
  if (!plain) return nlohmann::json(names).dump();
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += names[i];
  }
  return out;
}

// The preprocessing and model facts, shared by metadata_props and inference.json.
struct Facts {
  std::string output_name;
  int64_t resize_size = 0;
  std::string input_size;  // "224" (square), "3,224,192" (C,H,W) or "dynamic"
  std::map<std::string, std::string> metadata;
};

Facts collect_facts(const OnnxExportOptions& o, int64_t num_classes) {
  Facts f;
  f.output_name = !o.output_name.empty() ? o.output_name : o.softmax ? "probs" : "logits";
  f.resize_size = o.resize_size > 0 ? o.resize_size : o.height * 256 / 224;
  if (o.height > 0 && o.width > 0) {
    f.input_size = o.height == o.width
                       ? std::to_string(o.height)
                       : std::to_string(o.channels) + "," + std::to_string(o.height) + "," +
                             std::to_string(o.width);
  } else {
    f.input_size = "dynamic";
  }
  auto& m = f.metadata;
  m["model_name"] = o.model_name;
  m["framework"] = "dpar";
  m["dpar_version"] = version();
  m["dpar_commit"] = git_commit();
  m["input_name"] = o.input_name;
  if (image_input(o)) {
    m["input_layout"] = "NCHW";
    m["input_size"] = f.input_size;
    m["color_format"] = "RGB";
    m["pixel_scale"] = float_str(1.0f / 255.0f);
    m["mean"] = join_floats(o.mean);
    m["std"] = join_floats(o.std);
    m["resize_size"] = std::to_string(f.resize_size);
  } else {
    m["input_layout"] = "tensor";
    std::string dims;
    for (int64_t d : declared_input_dims(o)) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    m["input_shape"] = dims;
  }
  m["output_name"] = f.output_name;
  m["softmax"] = o.softmax ? "true" : "false";
  m["num_classes"] = std::to_string(num_classes);
  m["class_names"] = class_names_text(o.class_names);
  for (const auto& [k, v] : o.metadata) m[k] = v;
  return f;
}

// Floats as the doubles their shortest decimal form denotes: 0.286f is written 0.286, not
// 0.28600001335144043.
std::vector<double> json_floats(const std::vector<float>& v) {
  std::vector<double> out;
  for (float x : v) out.push_back(std::stod(float_str(x)));
  return out;
}

std::string make_json(const OnnxExportOptions& o, const Facts& f, int64_t num_classes) {
  nlohmann::ordered_json j;
  j["format"] = "onnx";
  j["model_file"] = "inference.onnx";
  j["model_name"] = o.model_name;
  j["input_name"] = o.input_name;
  j["input_shape"] = declared_input_dims(o);
  j["output_name"] = f.output_name;
  j["softmax"] = o.softmax;
  j["num_classes"] = num_classes;
  j["class_names"] = o.class_names;
  if (image_input(o)) {
    j["preprocess"] = {{"color_format", "RGB"},
                       {"layout", "NCHW"},
                       {"pixel_scale", 1.0 / 255.0},
                       {"resize_size", f.resize_size},
                       {"crop_size", {o.height, o.width}},
                       {"mean", json_floats(o.mean)},
                       {"std", json_floats(o.std)}};
  } else {
    j["preprocess"] = nullptr;  // not an image: the caller prepares the tensor
  }
  j["dpar_version"] = version();
  j["dpar_commit"] = git_commit();
  return j.dump(2) + "\n";
}

// Writes bytes to path with POSIX calls so they can be fsynced before the rename.
void write_synced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DPAR_CHECK(fd >= 0, "export_onnx: cannot write ", path, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      std::remove(path.c_str());
      DPAR_FAIL("export_onnx: cannot write ", path, ": ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    std::remove(path.c_str());
    DPAR_FAIL("export_onnx: cannot write ", path, ": ", std::strerror(err));
  }
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the renames happened; a directory that cannot be opened is not fatal
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string serialize_onnx(const OnnxGraph& graph, const OnnxExportOptions& options,
                           OnnxExportResult* info) {
  check_options(options);
  DPAR_CHECK(graph.input == options.input_name, "export_onnx: graph input '", graph.input,
             "' differs from the options' input name '", options.input_name, "'");
  Facts facts = collect_facts(options, 0);

  onnx::ModelProto model;
  // LayerNormalization entered the default domain in opset 17, which IR version 8 pairs with;
  // graphs without it keep the older, more widely read pair.
  const bool needs_17 = std::any_of(graph.nodes.begin(), graph.nodes.end(), [](const OnnxNode& n) {
    return n.op_type == "LayerNormalization";
  });
  model.set_ir_version(needs_17 ? 8 : kIrVersion);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(needs_17 ? 17 : kOpset);
  model.set_producer_name("dpar");
  model.set_producer_version(version());
  model.set_model_version(1);
  model.set_doc_string(options.model_name + " exported by dpar " + version() + " (commit " +
                       git_commit() +
                       ") for inference: BatchNorm folded into the Conv before it, dropout "
                       "removed");

  onnx::GraphProto* g = model.mutable_graph();
  g->set_name(options.model_name);

  onnx::ValueInfoProto* in = g->add_input();
  in->set_name(graph.input);
  auto* in_type = in->mutable_type()->mutable_tensor_type();
  in_type->set_elem_type(onnx::TensorProto::FLOAT);
  auto* in_shape = in_type->mutable_shape();
  if (image_input(options)) {
    set_dim(in_shape->add_dim(), options.fixed_batch, "batch");
    set_dim(in_shape->add_dim(), options.channels, "channels");
    set_dim(in_shape->add_dim(), options.height, "height");
    set_dim(in_shape->add_dim(), options.width, "width");
  } else {
    for (size_t i = 0; i < options.input_shape.size(); ++i) {
      set_dim(in_shape->add_dim(), options.input_shape[i], "dim" + std::to_string(i));
    }
  }

  int64_t num_parameters = 0;
  for (const auto& [name, t] : graph.initializers) {
    DPAR_CHECK((t.dtype() == DType::f32 || t.dtype() == DType::i64) && t.is_contiguous(),
               "export_onnx: constant '", name, "' must be a contiguous f32 or i64 tensor, got ",
               t.str());
    onnx::TensorProto* tp = g->add_initializer();
    tp->set_name(name);
    for (int64_t d : t.shape()) tp->add_dims(d);
    if (t.dtype() == DType::i64) {  // shapes, indices, pads: not parameters
      tp->set_data_type(onnx::TensorProto::INT64);
      tp->set_raw_data(t.raw_data(), t.nbytes());
      continue;
    }
    num_parameters += t.numel();
    auto q = graph.quantized_initializers.find(name);
    if (q == graph.quantized_initializers.end()) {
      tp->set_data_type(onnx::TensorProto::FLOAT);
      tp->set_raw_data(t.raw_data(), t.nbytes());
      continue;
    }
    // Integer values held as f32: written as one byte each (two's complement for int8).
    const bool is_signed = q->second == "int8";
    DPAR_CHECK(is_signed || q->second == "uint8", "export_onnx: constant '", name,
               "' has quantized type '", q->second, "', expected int8 or uint8");
    tp->set_data_type(is_signed ? onnx::TensorProto::INT8 : onnx::TensorProto::UINT8);
    std::string bytes(static_cast<size_t>(t.numel()), '\0');
    const float* v = t.data<float>();
    for (size_t i = 0; i < bytes.size(); ++i) {
      const float lo = is_signed ? -128.f : 0.f, hi = is_signed ? 127.f : 255.f;
      DPAR_CHECK(v[i] == std::nearbyint(v[i]) && v[i] >= lo && v[i] <= hi,
                 "export_onnx: constant '", name, "' holds ", v[i], ", not a ", q->second,
                 " value");
      bytes[i] = static_cast<char>(static_cast<int>(v[i]));
    }
    tp->set_raw_data(bytes);
  }

  // The value the model returns gets the public output name: through a Softmax over the
  // classes when asked for, else by renaming the last producer's output.
  std::vector<OnnxNode> nodes = graph.nodes;
  for (const OnnxNode& n : nodes) {
    DPAR_CHECK(n.output != facts.output_name && n.name != facts.output_name,
               "export_onnx: output name '", facts.output_name, "' is taken by node ", n.name);
  }
  if (options.softmax) {
    OnnxNode sm;
    sm.op_type = "Softmax";
    sm.name = "Softmax";
    while (std::any_of(nodes.begin(), nodes.end(),
                       [&](const OnnxNode& n) { return n.name == sm.name; })) {
      sm.name += "_";
    }
    sm.inputs = {graph.output};
    sm.output = facts.output_name;
    sm.attributes = {{"axis", int64_t{1}}};
    nodes.push_back(std::move(sm));
  } else {
    auto producer = std::find_if(nodes.begin(), nodes.end(),
                                 [&](const OnnxNode& n) { return n.output == graph.output; });
    DPAR_CHECK(producer != nodes.end(), "export_onnx: the graph output '", graph.output,
               "' is not computed by any node");
    producer->output = facts.output_name;
    for (OnnxNode& n : nodes)
      std::replace(n.inputs.begin(), n.inputs.end(), graph.output, facts.output_name);
  }

  std::map<std::string, int64_t> op_counts;
  for (const OnnxNode& n : nodes) {
    onnx::NodeProto* np = g->add_node();
    np->set_op_type(n.op_type);
    np->set_name(n.name);
    for (const std::string& i : n.inputs) np->add_input(i);
    np->add_output(n.output);
    for (const auto& [key, value] : n.attributes) set_attribute(*np, key, value);
    ++op_counts[n.op_type];
  }
  onnx::ValueInfoProto* out = g->add_output();
  out->set_name(facts.output_name);
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);

  // Strict shape inference: every node's types and shapes must be consistent, and it gives
  // the output's shape ([batch, classes]) for the output declaration and the metadata.
  try {
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/true,
                                                                   /*strict_mode=*/1));
  } catch (const std::exception& e) {
    DPAR_FAIL("export_onnx: ONNX shape inference rejected the graph of ", options.model_name, ": ",
              one_line(e.what()));
  }
  const auto& out_type = g->output(0).type().tensor_type();
  DPAR_CHECK(out_type.has_shape() && out_type.shape().dim_size() == 2 &&
                 out_type.shape().dim(1).has_dim_value(),
             "export_onnx: the model's output should be [batch, classes], shape inference found ",
             out_type.has_shape() ? std::to_string(out_type.shape().dim_size()) + " dimensions"
                                  : std::string("no shape"));
  const int64_t num_classes = out_type.shape().dim(1).dim_value();
  DPAR_CHECK(options.class_names.empty() ||
                 static_cast<int64_t>(options.class_names.size()) == num_classes,
             "export_onnx: ", options.class_names.size(), " class names for a model with ",
             num_classes, " classes");

  facts = collect_facts(options, num_classes);
  for (const auto& [key, value] : facts.metadata) {
    onnx::StringStringEntryProto* e = model.add_metadata_props();
    e->set_key(key);
    e->set_value(value);
  }

  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    DPAR_FAIL("export_onnx: the ONNX checker rejected the model ", options.model_name, ": ",
              one_line(e.what()));
  }
  std::string bytes;
  DPAR_CHECK(model.SerializeToString(&bytes), "export_onnx: protobuf could not serialize ",
             options.model_name, " (", num_parameters, " parameters)");

  if (info != nullptr) {
    info->num_nodes = static_cast<int64_t>(nodes.size());
    info->num_classes = num_classes;
    info->num_parameters = num_parameters;
    info->op_counts = std::move(op_counts);
    info->metadata = facts.metadata;
  }
  return bytes;
}

OnnxExportResult export_onnx(const nn::Module& module, const std::string& dir,
                             const OnnxExportOptions& options, const OnnxLowerings& lowerings) {
  DPAR_CHECK(!dir.empty(), "export_onnx: the output directory must not be empty");
  OnnxGraph graph = lower_to_onnx(module, options, lowerings);
  OnnxExportResult result;
  if (options.fold_batch_norm) result.folded_batch_norms = fold_batch_norms(graph);
  if (options.graph_pass) options.graph_pass(graph);
  const std::string bytes = serialize_onnx(graph, options, &result);
  const std::string json =
      options.write_json
          ? make_json(options, collect_facts(options, result.num_classes), result.num_classes)
          : std::string();

  // Everything is validated before the disk is touched.
  std::error_code ec;
  fs::create_directories(dir, ec);
  DPAR_CHECK(!ec && fs::is_directory(dir), "export_onnx: cannot create output directory ", dir,
             ": ", ec ? ec.message() : std::string("exists and is not a directory"));
  result.model_path = (fs::path(dir) / "inference.onnx").string();
  if (options.write_json) result.json_path = (fs::path(dir) / "inference.json").string();

  // Both files complete under temporary names before either final name changes.
  const std::string model_tmp = result.model_path + ".tmp";
  const std::string json_tmp = options.write_json ? result.json_path + ".tmp" : std::string();
  write_synced(model_tmp, bytes);
  if (options.write_json) {
    try {
      write_synced(json_tmp, json);
    } catch (...) {
      std::remove(model_tmp.c_str());
      throw;
    }
  }
  auto rename_or_fail = [&](const std::string& from, const std::string& to) {
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      const int err = errno;
      std::remove(model_tmp.c_str());
      if (options.write_json) std::remove(json_tmp.c_str());
      DPAR_FAIL("export_onnx: cannot rename ", from, " to ", to, ": ", std::strerror(err));
    }
  };
  rename_or_fail(model_tmp, result.model_path);
  if (options.write_json) rename_or_fail(json_tmp, result.json_path);
  sync_directory(dir);
  return result;
}

}  // namespace dpar::io
