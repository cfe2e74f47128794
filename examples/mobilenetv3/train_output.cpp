#include "train_output.h"

#include <cstdio>
#include <filesystem>

#include "dpar/nn/weights.h"
#include "model/mobilenet_v3_onnx.h"

namespace mobilenetv3 {

using namespace dpar;

void write_outputs(const models::MobileNetV3& model, const DataSplits& splits,
                   const OutputOptions& options) {
  if (options.dir.empty()) return;
  std::filesystem::create_directories(options.dir);
  const std::string path = options.dir + "/" + options.model_name + ".safetensors";
  nn::save_weights(model, path);
  std::printf("saved weights to %s\n", path.c_str());
  if (options.export_inference) {
    io::OnnxExportOptions ex;
    ex.model_name = options.model_name;
    ex.height = ex.width = options.img_size;
    ex.resize_size = splits.resize_size;
    ex.mean.assign(splits.mean.begin(), splits.mean.end());
    ex.std.assign(splits.std.begin(), splits.std.end());
    if (options.num_classes == static_cast<int64_t>(splits.train->class_names().size())) {
      ex.class_names = splits.train->class_names();
    }
    const std::string dir = options.dir + "/inference";
    const io::OnnxExportResult r = models::export_mobilenet_v3(model, dir, ex);
    std::printf("exported the inference model to %s (%lld BatchNorms folded, %lld classes)\n",
                r.model_path.c_str(), static_cast<long long>(r.folded_batch_norms),
                static_cast<long long>(r.num_classes));
  }
  std::fflush(stdout);
}

}  // namespace mobilenetv3
