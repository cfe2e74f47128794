// Classifies images with an exported ONNX model on dpar::infer (oneDNN, CPU), in the shape of
// PaddleClas' inference program: one `image_name: X, class_id: N, prob: P` line per image and,
// with --benchmark, an AutoLog-style report (Env / dpar / Conf / Model / Data / Perf info).
//   infer --model-dir out/inference --img-path demo.jpg
//   infer --model-dir out/inference --img-path images/ --batch-size 8 --cpu-threads 1
//         --benchmark=True --warmup 2
// Preprocessing is torchvision's eval pipeline: resize the shorter side, centre crop,
// normalise with the mean/std the model's metadata records.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "dpar/core/device.h"
#include "dpar/data/transforms.h"
#include "dpar/dpar.h"
#include "dpar/infer/runtime.h"
#include "infer_report.h"

using namespace dpar;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// --model-dir may name the export directory (inference.onnx inside) or the .onnx file itself.
std::string find_model(const std::string& dir) {
  std::error_code ec;
  DPAR_CHECK(!dir.empty(), "--model-dir is required (the directory export_model wrote)");
  DPAR_CHECK(fs::exists(dir, ec), "--model-dir ", dir, ": no such file or directory");
  if (!fs::is_directory(dir, ec)) return dir;
  const fs::path standard = fs::path(dir) / "inference.onnx";
  if (fs::exists(standard, ec)) return standard.string();
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".onnx") found.push_back(entry.path().string());
  }
  DPAR_CHECK(found.size() == 1, "--model-dir ", dir, ": no inference.onnx",
             found.empty() ? " and no other .onnx file" : " and several .onnx files", " in it");
  return found[0];
}

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp";
}

// A file, or the image files of a folder (not recursive) in name order.
std::vector<std::string> list_images(const std::string& path) {
  std::error_code ec;
  DPAR_CHECK(!path.empty(), "--img-path is required (an image file or a folder of images)");
  DPAR_CHECK(fs::exists(path, ec), "--img-path ", path, ": no such file or directory");
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::string> images;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.is_regular_file() && is_image_file(entry.path())) {
      images.push_back(entry.path().string());
    }
  }
  DPAR_CHECK(!images.empty(), "--img-path ", path,
             ": the folder has no images (.jpg, .jpeg, .png, .bmp)");
  std::sort(images.begin(), images.end());
  return images;
}

// Probabilities of one output row: the row itself when the model ends in Softmax.
std::vector<double> probabilities(const float* row, int64_t n, bool already) {
  std::vector<double> p(row, row + n);
  if (already) return p;
  const double top = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& v : p) sum += (v = std::exp(v - top));
  for (double& v : p) v /= sum;
  return p;
}

// ", topk_class_ids: [..], topk_probs: [..]" and label_names when the model has them.
std::string topk_text(const std::vector<int64_t>& order, const std::vector<double>& p, int64_t k,
                      const std::vector<std::string>& names) {
  std::string ids, probs, labels;
  const bool named = names.size() == p.size();
  for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
    const size_t c = static_cast<size_t>(order[j]);
    if (j) {
      ids += ", ";
      probs += ", ";
      labels += ", ";
    }
    ids += std::to_string(c);
    probs += format_prob(p[c]);
    if (named) labels += names[c];
  }
  std::string out = ", topk_class_ids: [" + ids + "], topk_probs: [" + probs + "]";
  if (named) out += ", label_names: [" + labels + "]";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("infer", [&] {
    Flags flags("infer", "Classifies images with an exported ONNX model (dpar::infer, CPU)");
    auto& model_dir =
        flags.add_string("model-dir", "", "export directory (inference.onnx) or .onnx file");
    auto& img_path = flags.add_string("img-path", "", "an image file or a folder of images");
    auto& batch_size = flags.add_int("batch-size", 1, "images per model run");
    auto& resize_size = flags.add_int(
        "resize-size", 256,
        "shorter side before the centre crop (default: the model's metadata, else 256)");
    auto& crop_size = flags.add_int("crop-size", 224,
                                    "centre crop side (default: the model's input size, else 224)");
    auto& use_gpu = flags.add_bool("use-gpu", false, "run on the GPU (needs a CUDA build)");
    auto& precision = flags.add_string(
        "precision", "fp32",
        "fp32; fp16 on the GPU (convolutions and Gemm in f16); or int8 on the CPU for an int8 "
        "(QDQ) model from export_model --precision int8");
    auto& cpu_threads =
        flags.add_int("cpu-threads", 0, "intra-op threads (0: OMP_NUM_THREADS, else all cores)");
    auto& benchmark =
        flags.add_bool("benchmark", false, "print the AutoLog-style benchmark report");
    auto& warmup =
        flags.add_int("warmup", 0, "untimed runs of the first batch before the timed pass");
    auto& topk = flags.add_int("topk", 1, "also print the k most likely classes when k > 1");
    flags.parse(argc, argv);

    auto at_least = [](const char* flag, int64_t value, int64_t min) {
      if (value < min) {
        throw FlagError(std::string("--") + flag + "=" + std::to_string(value) +
                        ": expected >= " + std::to_string(min));
      }
    };
    at_least("batch-size", batch_size, 1);
    at_least("cpu-threads", cpu_threads, 0);
    at_least("warmup", warmup, 0);
    at_least("topk", topk, 1);
    if (precision != "fp32" && precision != "int8" && precision != "fp16") {
      throw FlagError("--precision=" + precision + ": expected fp32, fp16 (GPU) or int8 (CPU)");
    }
    if (precision == "fp16" && !use_gpu) {
      throw FlagError(
          "--precision=fp16: half-precision inference runs on the GPU "
          "(--use-gpu=True)");
    }
    const Device device = use_gpu ? Device::cuda(0) : Device::cpu();
    if (use_gpu) {
      if (precision == "int8") {
        throw FlagError("--precision=int8: int8 models run on the CPU (--use-gpu=False)");
      }
      try {
        check_device_available(device);
      } catch (const Error& e) {
        throw FlagError(std::string("--use-gpu=True: ") + e.what() + "; use --use-gpu=False");
      }
    }

    const std::string model_path = find_model(model_dir);
    const std::vector<std::string> images = list_images(img_path);
    infer::Model model = infer::Model::load(model_path);
    const infer::ModelInfo& info = model.info();
    DPAR_CHECK(info.image_input, model_path, ": the model's input is a tensor ", info.input_shape,
               ", not an image (input_layout \"tensor\"); infer classifies images - run such a "
               "model with dpar::infer::Model::run on a tensor you prepare");
    model.set_num_threads(static_cast<int>(cpu_threads));
    // fp16 is how the GPU computes an fp32 model (convolutions and Gemm in f16), not a file kind.
    model.set_device(device, precision == "fp16" ? DType::f16 : DType::f32);
    // The precision is the model's: an int8 model runs its Conv/Gemm in int8 whatever the
    // flag says, so the flag must agree with the file (and the report tells the truth).
    if (precision != "fp16" && precision != info.precision) {
      throw FlagError("--precision=" + precision + ": " + model_path + " is an " + info.precision +
                      " model" +
                      (precision == "int8" ? " (export one with export_model --precision int8)"
                                           : " (pass --precision int8)"));
    }

    // The model's own preprocessing facts win over the defaults, flags given explicitly over both.
    if (!flags.was_set("resize-size") && info.resize_size > 0) resize_size = info.resize_size;
    if (!flags.was_set("crop-size") && info.input_height > 0) {
      DPAR_CHECK(info.input_height == info.input_width, model_path, ": the model takes ",
                 info.input_height, "x", info.input_width,
                 " images; infer makes square crops only");
      crop_size = info.input_height;
    }
    DPAR_CHECK(
        info.input_height <= 0 || (info.input_height == crop_size && info.input_width == crop_size),
        "--crop-size=", crop_size, " does not fit ", model_path, ", which takes ",
        info.input_height, "x", info.input_width, " images");
    // A model of one channel (the ViT example's grey Fashion-MNIST) gets grey images.
    const int64_t channels = info.input_shape.size() == 4 && info.input_shape[1] == 1 ? 1 : 3;
    std::vector<std::shared_ptr<const data::Transform>> steps{
        std::make_shared<data::Resize>(resize_size), std::make_shared<data::CenterCrop>(crop_size)};
    if (channels == 1) steps.push_back(std::make_shared<data::Grayscale>());
    const data::Compose transform(
        steps, channels == 1 ? data::ToTensorNormalize::grey(info.mean[0], info.std[0])
                             : data::ToTensorNormalize(info.mean, info.std));

    const int64_t n_images = static_cast<int64_t>(images.size());
    const int64_t full = std::min<int64_t>(batch_size, n_images);
    // Plans (primitives, reordered weights, buffers) for the batch shapes this run will see.
    if (device.is_cpu()) {
      model.prepare({full, channels, crop_size, crop_size});
      if (n_images % full) model.prepare({n_images % full, channels, crop_size, crop_size});
    }

    Generator rng(0);  // the eval transforms draw nothing; Compose wants a generator anyway
    auto load_batch = [&](int64_t first, int64_t count) {
      Tensor batch = Tensor::empty({count, channels, crop_size, crop_size});
      const int64_t per_image = channels * crop_size * crop_size;
      for (int64_t i = 0; i < count; ++i) {
        const Tensor x = transform(data::read_image(images[static_cast<size_t>(first + i)]), rng);
        std::copy_n(x.data<float>(), per_image, batch.data<float>() + i * per_image);
      }
      return batch;
    };

    if (warmup > 0) {
      const Tensor first = load_batch(0, full);
      for (int64_t i = 0; i < warmup; ++i) model.run(first);
    }
    double pre_ms = 0, infer_ms = 0, post_ms = 0;
    const auto start = Clock::now();
    for (int64_t first = 0; first < n_images; first += full) {
      const int64_t count = std::min(full, n_images - first);
      auto t0 = Clock::now();
      const Tensor batch = load_batch(first, count);
      pre_ms += ms_since(t0);
      t0 = Clock::now();
      Tensor out = model.run(batch);
      if (out.device().is_cuda()) out = out.to(Device::cpu());  // waits for the GPU's work
      infer_ms += ms_since(t0);
      t0 = Clock::now();
      const int64_t classes = out.numel() / count;
      for (int64_t i = 0; i < count; ++i) {
        const std::vector<double> p =
            probabilities(out.data<float>() + i * classes, classes, info.outputs_probabilities);
        std::vector<int64_t> order(p.size());
        std::iota(order.begin(), order.end(), 0);
        const int64_t k = std::min<int64_t>(topk, classes);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
          return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] ||
                 (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
        });
        std::string line = "image_name: " + images[static_cast<size_t>(first + i)] +
                           ", class_id: " + std::to_string(order[0]) +
                           ", prob: " + format_prob(p[static_cast<size_t>(order[0])]);
        if (k > 1) line += topk_text(order, p, k, info.class_names);
        std::printf("%s\n", line.c_str());
      }
      std::fflush(stdout);
      post_ms += ms_since(t0);
    }
    const double total_s = ms_since(start) / 1e3;

    if (benchmark) {
      ReportFacts facts;
      facts.model_name = info.name;
      facts.precision = precision;
      facts.threads = model.num_threads();
      facts.batch_size = batch_size;
      facts.input_shape = {3, crop_size, crop_size};
      facts.images = n_images;
      facts.total_s = total_s;
      facts.preprocess_ms = pre_ms / static_cast<double>(n_images);
      facts.inference_ms = infer_ms / static_cast<double>(n_images);
      facts.postprocess_ms = post_ms / static_cast<double>(n_images);
      if (device.is_cuda()) {
        facts.gpu_device = device.str();
        facts.gpu_peak_mb =
            static_cast<double>(allocator_for(device).stats().peak_allocated_bytes) / (1 << 20);
      }
      std::printf("%s", benchmark_report(facts).c_str());
    }
    return 0;
  });
}
