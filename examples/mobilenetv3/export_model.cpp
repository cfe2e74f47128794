// Exports trained MobileNetV3 weights as an inference model, like PaddlePaddle's
// tools/export_model.py: BatchNorm folded into the convolutions, dropout removed, a Softmax
// appended (unless --no-softmax), a dynamic batch dimension, and the preprocessing and class
// names in the model's metadata.
//   export_model --model mobilenet_v3_small --pretrained out/latest.ckpt --img-size 224
//                --save-inference-dir out/inference
// writes out/inference/inference.onnx and out/inference/inference.json. --pretrained takes a
// training checkpoint (its model part) or a .safetensors state dict (train --output-dir, or
// torchvision's state_dict saved as safetensors).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dpar/dpar.h"
#include "dpar/io/checkpoint.h"
#include "dpar/io/safetensors.h"
#include "model/mobilenet_v3.h"
#include "model/mobilenet_v3_onnx.h"

using namespace dpar;

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) {
    const size_t b = item.find_first_not_of(" \t\r");
    const size_t e = item.find_last_not_of(" \t\r");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

std::vector<float> parse_floats(const std::string& flag, const std::string& text) {
  std::vector<float> out;
  for (const std::string& s : split(text, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stof(s, &used));
      if (used != s.size()) throw std::invalid_argument(s);
    } catch (const std::exception&) {
      throw FlagError("export_model: --" + flag + "=" + text +
                      ": expected comma-separated numbers");
    }
  }
  if (out.size() != 3) {
    throw FlagError("export_model: --" + flag + "=" + text + ": expected 3 values (R,G,B)");
  }
  return out;
}

// --class-names: "a,b,c", or a file with one name per line.
std::vector<std::string> parse_class_names(const std::string& value) {
  if (value.empty()) return {};
  if (std::filesystem::is_regular_file(value)) {
    std::ifstream in(value);
    std::vector<std::string> names;
    for (std::string line; std::getline(in, line);) {
      for (std::string& n : split(line, '\n')) names.push_back(std::move(n));
    }
    return names;
  }
  return split(value, ',');
}

struct Weights {
  nn::NamedTensors tensors;
  std::string kind;                  // "checkpoint" or "weights file"
  std::vector<std::string> classes;  // class names recorded with the weights, if any
};

Weights read_weights(const std::string& path) {
  DPAR_CHECK(std::filesystem::is_regular_file(path), "--pretrained ", path,
             " does not exist or is not a file");
  Weights w;
  std::string recorded;
  if (io::is_checkpoint_file(path)) {
    io::Checkpoint ck = io::load_checkpoint(path);  // verifies the checksum
    w.tensors = std::move(ck.model);
    w.kind = "checkpoint";
    if (auto it = ck.state.extra.find("class_names"); it != ck.state.extra.end()) {
      recorded = it->second;
    }
  } else {
    io::SafetensorsContents c = io::load_safetensors(path);
    w.tensors = std::move(c.tensors);
    w.kind = "weights file";
    if (auto it = c.metadata.find("class_names"); it != c.metadata.end()) recorded = it->second;
  }
  w.classes = split(recorded, ',');
  return w;
}

int64_t classes_in(const nn::NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    if (name == "classifier.3.weight" && t.dim() == 2) return t.size(0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("export_model", [&] {
    Flags flags("export_model", "Exports trained MobileNetV3 weights as an ONNX inference model.");
    auto& model_name =
        flags.add_string("model", "mobilenet_v3_small", "mobilenet_v3_small or mobilenet_v3_large");
    auto& pretrained = flags.add_string(
        "pretrained", "", "checkpoint (.ckpt) or state dict (.safetensors) to export");
    auto& num_classes = flags.add_int("num-classes", 0, "classes (0: from the weights)");
    auto& img_size = flags.add_int("img-size", 224, "input image side (the crop size)");
    auto& resize_size = flags.add_int("resize-size", 0,
                                      "shorter side before the centre crop (0: img-size*256/224)");
    auto& save_dir = flags.add_string("save-inference-dir", "",
                                      "directory for inference.onnx and inference.json");
    auto& softmax = flags.add_bool("softmax", true, "append a Softmax (outputs probabilities)");
    auto& no_softmax =
        flags.add_bool("no-softmax", false, "output logits (same as --softmax=false)");
    auto& class_names = flags.add_string(
        "class-names", "", "comma-separated class names, or a file with one per line");
    auto& mean = flags.add_string("mean", "0.485,0.456,0.406", "per-channel mean (of x/255)");
    auto& std_dev = flags.add_string("std", "0.229,0.224,0.225", "per-channel std (of x/255)");
    flags.parse(argc, argv);

    if (pretrained.empty()) throw FlagError("export_model: --pretrained is required");
    if (save_dir.empty()) throw FlagError("export_model: --save-inference-dir is required");
    if (model_name != "mobilenet_v3_small" && model_name != "mobilenet_v3_large") {
      throw FlagError("export_model: --model=" + model_name +
                      ": expected mobilenet_v3_small or mobilenet_v3_large");
    }
    if (img_size < 16) throw FlagError("export_model: --img-size must be >= 16");
    if (num_classes < 0) throw FlagError("export_model: --num-classes must be >= 0");
    if (resize_size < 0) throw FlagError("export_model: --resize-size must be >= 0");
    io::OnnxExportOptions options;
    options.model_name = model_name;
    options.height = options.width = img_size;
    options.resize_size = resize_size;
    options.softmax = softmax && !no_softmax;
    options.mean = parse_floats("mean", mean);
    options.std = parse_floats("std", std_dev);
    options.class_names = parse_class_names(class_names);

    const Weights weights = read_weights(pretrained);
    const int64_t in_file = classes_in(weights.tensors);
    const int64_t classes = num_classes > 0 ? num_classes : in_file;
    DPAR_CHECK(classes > 0, "cannot tell the number of classes: ", pretrained,
               " has no classifier.3.weight; pass --num-classes");
    if (options.class_names.empty() && static_cast<int64_t>(weights.classes.size()) == classes) {
      options.class_names = weights.classes;
    }

    auto model = models::mobilenet_v3(model_name, classes);
    const nn::LoadReport report = model->compare_state_dict(weights.tensors);
    DPAR_CHECK(report.ok(), "the ", weights.kind, " ", pretrained, " does not fit ", model_name,
               " with ", classes, " classes: ", io::describe_mismatch(report));
    model->load_state_dict(weights.tensors, /*strict=*/true);
    model->eval();

    const io::OnnxExportResult r = models::export_mobilenet_v3(*model, save_dir, options);
    std::string ops;
    for (const auto& [op, n] : r.op_counts) {
      if (!ops.empty()) ops += ", ";
      ops += op;
      ops += " x";
      ops += std::to_string(n);
    }
    std::printf("exported %s (%lld classes, input [batch,3,%lld,%lld], output %s) from %s %s\n",
                model_name.c_str(), static_cast<long long>(r.num_classes),
                static_cast<long long>(img_size), static_cast<long long>(img_size),
                r.metadata.at("output_name").c_str(), weights.kind.c_str(), pretrained.c_str());
    std::printf("  %lld nodes (%s), %lld BatchNorms folded, %lld parameters\n",
                static_cast<long long>(r.num_nodes), ops.c_str(),
                static_cast<long long>(r.folded_batch_norms),
                static_cast<long long>(r.num_parameters));
    std::printf("  wrote %s and %s\n", r.model_path.c_str(), r.json_path.c_str());
    return 0;
  });
}
