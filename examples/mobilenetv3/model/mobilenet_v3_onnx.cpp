#include "model/mobilenet_v3_onnx.h"

namespace dpar::models {

void add_mobilenet_v3_lowerings(io::OnnxLowerings& lowerings) {
  // Each lowering mirrors the module's forward() line by line; children are lowered under
  // their registered names so nodes and constants carry the state-dict paths.
  lowerings.add<SqueezeExcitation>(
      [](const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
        const auto& se = static_cast<const SqueezeExcitation&>(m);
        std::string scale = b.lower(*se.avgpool, "avgpool", x);
        scale = b.lower(*se.activation, "activation", b.lower(*se.fc1, "fc1", scale));
        scale = b.lower(*se.scale_activation, "scale_activation", b.lower(*se.fc2, "fc2", scale));
        return b.add_node("Mul", {scale, x});
      });
  lowerings.add<InvertedResidual>(
      [](const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
        const auto& ir = static_cast<const InvertedResidual&>(m);
        const std::string y = b.lower(*ir.block, "block", x);
        return ir.use_res_connect ? b.add_node("Add", {y, x}) : y;
      });
  lowerings.add<MobileNetV3>(
      [](const nn::Module& m, const std::string& x, io::OnnxGraphBuilder& b) {
        const auto& net = static_cast<const MobileNetV3&>(m);
        std::string y = b.lower(*net.features, "features", x);
        y = b.lower(*net.avgpool, "avgpool", y);
        y = b.add_node("Flatten", {y}, {{"axis", int64_t{1}}});
        return b.lower(*net.classifier, "classifier", y);
      });
}

io::OnnxLowerings mobilenet_v3_lowerings() {
  io::OnnxLowerings lowerings;
  add_mobilenet_v3_lowerings(lowerings);
  return lowerings;
}

io::OnnxExportResult export_mobilenet_v3(const MobileNetV3& model, const std::string& dir,
                                         const io::OnnxExportOptions& options) {
  return io::export_onnx(model, dir, options, mobilenet_v3_lowerings());
}

}  // namespace dpar::models
