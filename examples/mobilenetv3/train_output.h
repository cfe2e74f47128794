#pragma once
// What a finished training run leaves in --output-dir (rank 0 writes it): the weights, and the
// ONNX inference model export_model would write from them. Shared by the fixed-world and the
// elastic trainer.
#include <cstdint>
#include <string>

#include "model/mobilenet_v3.h"
#include "train_data.h"

namespace mobilenetv3 {

struct OutputOptions {
  std::string dir;  // empty: nothing is written
  std::string model_name;
  int64_t img_size = 32;
  int64_t num_classes = 0;  // the head's
  // <dir>/inference: eval semantics (running statistics, no dropout) with BatchNorm folded,
  // the validation preprocessing and, when the head has the data's classes, their names.
  bool export_inference = true;
};

// Writes <dir>/<model_name>.safetensors and (export_inference) <dir>/inference/, printing a
// line for each.
void write_outputs(const dpar::models::MobileNetV3& model, const DataSplits& splits,
                   const OutputOptions& options);

}  // namespace mobilenetv3
