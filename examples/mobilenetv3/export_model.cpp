// Exports trained MobileNetV3 weights as an inference model, like PaddlePaddle's
// tools/export_model.py: BatchNorm folded into the convolutions, dropout removed, a Softmax
// appended (unless --no-softmax), a dynamic batch dimension, and the preprocessing and class
// names in the model's metadata.
//   export_model --model mobilenet_v3_small --pretrained out/latest.ckpt --img-size 224
//                --save-inference-dir out/inference
// writes out/inference/inference.onnx and out/inference/inference.json. --pretrained takes a
// training checkpoint (its model part) or a .safetensors state dict (train --output-dir, or
// torchvision's state_dict saved as safetensors).
//
// --precision int8 adds post-training quantization (io::quantize_qdq): the exported graph is
// calibrated on --calib-batches batches of --calib-data (an ImageNet-style folder, or
// "fashion-mnist" for Debian's copy) preprocessed as the model's metadata says, and written as
// an ONNX QDQ model with metadata "precision: int8".
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dpar/data/dataset.h"
#include "dpar/data/transforms.h"
#include "dpar/dpar.h"
#include "dpar/io/checkpoint.h"
#include "dpar/io/onnx_quantize.h"
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

std::string percent_text(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", p);
  return buf;
}

struct Calibration {
  std::string data;  // a folder, or "fashion-mnist"
  int64_t batches = 0;
  int64_t batch_size = 0;
  io::CalibrationOptions options;
};

// The calibration images with the model's eval preprocessing: resize (shorter side), centre
// crop, normalise. Fashion-MNIST's training split ("fashion-mnist": Debian's copy, or a folder
// of its idx files), or an image folder (with train/: the ImageNet layout train reads).
std::shared_ptr<const data::Dataset> calibration_data(const std::string& source,
                                                      const io::OnnxExportOptions& o) {
  const int64_t resize = o.resize_size > 0 ? o.resize_size : o.height * 256 / 224;
  const data::Compose tf(
      {std::make_shared<data::Resize>(resize), std::make_shared<data::CenterCrop>(o.height)},
      data::ToTensorNormalize({o.mean[0], o.mean[1], o.mean[2]}, {o.std[0], o.std[1], o.std[2]}));
  const std::filesystem::path root(source);
  if (source == "fashion-mnist" || std::filesystem::exists(root / "train-images-idx3-ubyte") ||
      std::filesystem::exists(root / "train-images-idx3-ubyte.gz")) {
    return std::make_shared<data::FashionMnist>(
        source == "fashion-mnist" ? data::FashionMnist::kDebianDir : source, data::Split::Train,
        tf);
  }
  const bool split = std::filesystem::is_directory(root / "train");
  return std::make_shared<data::ImageFolder>((split ? root / "train" : root).string(), tf);
}

// Calibrates the folded graph on evenly spaced examples (all classes of a sorted dataset) and
// inserts the QDQ nodes.
void quantize(io::OnnxGraph& graph, const Calibration& c, const io::OnnxExportOptions& o) {
  const auto dataset = calibration_data(c.data, o);
  const int64_t wanted = c.batches * c.batch_size;
  const int64_t n = std::min<int64_t>(wanted, static_cast<int64_t>(dataset->size()));
  DPAR_CHECK(n > 0, "--calib-data ", c.data, ": no images");
  io::OnnxCalibrator calibrator(graph, c.options);
  Generator rng(0);
  const double stride = static_cast<double>(dataset->size()) / static_cast<double>(n);
  for (int64_t first = 0; first < n; first += c.batch_size) {
    const int64_t count = std::min(c.batch_size, n - first);
    Tensor batch = Tensor::empty({count, o.channels, o.height, o.width});
    const int64_t per = o.channels * o.height * o.width;
    for (int64_t i = 0; i < count; ++i) {
      const auto index = static_cast<size_t>(static_cast<double>(first + i) * stride);
      const Tensor x = dataset->get(index, rng).image;
      std::copy_n(x.data<float>(), per, batch.data<float>() + i * per);
    }
    calibrator.observe(batch);
  }
  const io::QuantizeResult r = io::quantize_qdq(graph, calibrator);
  std::printf(
      "  int8: %lld Conv/Gemm nodes quantized (%lld uint8 and %lld int8 activations), "
      "calibrated on %lld images of %s\n",
      static_cast<long long>(r.quantized_nodes), static_cast<long long>(r.uint8_activations),
      static_cast<long long>(r.int8_activations), static_cast<long long>(n), c.data.c_str());
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
    auto& precision = flags.add_string("precision", "fp32", "fp32, or int8 (QDQ, calibrated)");
    auto& calib_data = flags.add_string(
        "calib-data", "",
        "int8: calibration images (an image folder, Fashion-MNIST idx folder, or fashion-mnist)");
    auto& calib_batches = flags.add_int("calib-batches", 8, "int8: calibration batches");
    auto& calib_batch_size = flags.add_int("calib-batch-size", 32, "int8: images per batch");
    auto& calib_method = flags.add_string("calib-method", "percentile",
                                          "int8: percentile (of each batch, averaged) or minmax");
    auto& calib_percentile = flags.add_double("calib-percentile", 99.99,
                                              "int8: percentile for --calib-method percentile");
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
    if (precision != "fp32" && precision != "int8") {
      throw FlagError("export_model: --precision=" + precision + ": expected fp32 or int8");
    }
    Calibration calib;
    if (precision == "int8") {
      if (calib_data.empty()) {
        throw FlagError(
            "export_model: --precision int8 needs --calib-data (a folder or fashion-mnist)");
      }
      if (calib_data != "fashion-mnist" && !std::filesystem::is_directory(calib_data)) {
        throw FlagError("export_model: --calib-data " + calib_data +
                        ": not a directory (or fashion-mnist)");
      }
      if (calib_batches < 1) throw FlagError("export_model: --calib-batches must be >= 1");
      if (calib_batch_size < 1) throw FlagError("export_model: --calib-batch-size must be >= 1");
      if (calib_method != "minmax" && calib_method != "percentile") {
        throw FlagError("export_model: --calib-method=" + calib_method +
                        ": expected minmax or percentile");
      }
      if (!(calib_percentile > 50 && calib_percentile <= 100)) {
        throw FlagError("export_model: --calib-percentile must be in (50, 100]");
      }
      calib = {calib_data,
               calib_batches,
               calib_batch_size,
               {calib_method == "minmax" ? io::CalibrationMethod::MinMax
                                         : io::CalibrationMethod::Percentile,
                calib_percentile}};
    } else {
      for (const char* f : {"calib-data", "calib-batches", "calib-batch-size", "calib-method",
                            "calib-percentile"}) {
        if (flags.was_set(f)) {
          throw FlagError(std::string("export_model: --") + f + " needs --precision int8");
        }
      }
    }
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

    if (precision == "int8") {
      options.metadata["precision"] = "int8";
      options.metadata["quantization"] =
          "QDQ; weights int8 per output channel (symmetric); activations uint8 when "
          "non-negative else int8, zero point 0; " +
          calib_method +
          (calib_method == "percentile" ? " " + percent_text(calib_percentile) : "") +
          " calibration on " + std::to_string(calib_batches) + " batches of " +
          std::to_string(calib_batch_size) + " from " + calib_data;
      options.graph_pass = [&](io::OnnxGraph& g) { quantize(g, calib, options); };
    }
    const io::OnnxExportResult r = models::export_mobilenet_v3(*model, save_dir, options);
    std::string ops;
    for (const auto& [op, n] : r.op_counts) {
      if (!ops.empty()) ops += ", ";
      ops += op;
      ops += " x";
      ops += std::to_string(n);
    }
    std::printf("exported %s%s (%lld classes, input [batch,3,%lld,%lld], output %s) from %s %s\n",
                model_name.c_str(), precision == "int8" ? " int8" : "",
                static_cast<long long>(r.num_classes), static_cast<long long>(img_size),
                static_cast<long long>(img_size), r.metadata.at("output_name").c_str(),
                weights.kind.c_str(), pretrained.c_str());
    std::printf("  %lld nodes (%s), %lld BatchNorms folded, %lld parameters\n",
                static_cast<long long>(r.num_nodes), ops.c_str(),
                static_cast<long long>(r.folded_batch_norms),
                static_cast<long long>(r.num_parameters));
    std::printf("  wrote %s and %s\n", r.model_path.c_str(), r.json_path.c_str());
    return 0;
  });
}
