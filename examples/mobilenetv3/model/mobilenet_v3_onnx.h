#pragma once
// ONNX export of MobileNetV3: lowerings for the model's composite modules (those with their own
// forward), on top of dpar's built-in layer lowerings. Conv2dNormActivation is a Sequential
// and needs none.
#include <string>

#include "dpar/io/onnx_export.h"
#include "model/mobilenet_v3.h"

namespace dpar::models {

// Adds SqueezeExcitation (GlobalAveragePool, Conv, Relu, Conv, HardSigmoid, Mul),
// InvertedResidual (block, then Add when it has the residual connection) and MobileNetV3
// (features, GlobalAveragePool, Flatten, classifier).
void add_mobilenet_v3_lowerings(io::OnnxLowerings& lowerings);

// The built-in lowerings plus MobileNetV3's.
io::OnnxLowerings mobilenet_v3_lowerings();

// Exports model (BatchNorm folded, dropout removed) to <dir>/inference.onnx and
// <dir>/inference.json; see io::export_onnx.
io::OnnxExportResult export_mobilenet_v3(const MobileNetV3& model, const std::string& dir,
                                         const io::OnnxExportOptions& options);

}  // namespace dpar::models
