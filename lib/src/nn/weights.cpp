#include "dpar/nn/weights.h"

namespace dpar::nn {

void save_weights(const Module& module, const std::string& path, const io::Metadata& metadata) {
  io::save_safetensors(path, module.state_dict(), metadata);
}

LoadReport load_weights(Module& module, const std::string& path, bool strict) {
  const io::SafetensorsContents contents = io::load_safetensors(path);
  // Compared first so a strict failure names the file and leaves the module untouched.
  const LoadReport check = module.compare_state_dict(contents.tensors);
  if (strict && !check.ok()) {
    const size_t problems =
        check.missing.size() + check.unexpected.size() + check.mismatched.size();
    DPAR_FAIL("load_weights: ", path, " does not match ", module.type_name(), " (", problems,
              " problem(s), nothing was loaded):\n", check.str());
  }
  return module.load_state_dict(contents.tensors, /*strict=*/false);
}

}  // namespace dpar::nn
