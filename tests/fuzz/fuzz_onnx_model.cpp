// The ONNX loader and planner: infer::Model from a file (fp32 or int8 QDQ), then, when the input
// shape is fixed and small, the execution plan for it and one run. Models come from exporters
// users do not control, so a bad file must end in one error naming it, never a crash.
#include "dpar/infer/runtime.h"
#include "fuzz_util.h"

namespace {

// Runs the graph only for inputs of at most this many elements: planning a huge declared shape
// is legitimate work, not a finding, and would only slow the fuzzer down.
constexpr int64_t kMaxRunElements = 1 << 14;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = dpar::fuzz::write_scratch("model.onnx", data, size);
  dpar::fuzz::expect_only_dpar_errors("fuzz_onnx_model", [&] {
    dpar::infer::Model model = dpar::infer::Model::load(path);
    model.set_num_threads(1);
    dpar::Shape shape = model.info().input_shape;
    int64_t elements = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] < 0) shape[i] = i == 0 ? 1 : 8;  // dynamic batch 1, dynamic sides 8
      if (shape[i] == 0 || shape[i] > kMaxRunElements) return;
      elements *= shape[i];
      if (elements > kMaxRunElements) return;
    }
    if (shape.empty()) return;
    (void)model.run(dpar::Tensor::zeros(shape));
  });
  return 0;
}
