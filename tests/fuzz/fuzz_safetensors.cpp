// The .safetensors reader: a file from anywhere (Hugging Face, PyTorch tooling, a damaged disk).
#include "dpar/io/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = dpar::fuzz::write_scratch("input.safetensors", data, size);
  dpar::fuzz::expect_only_dpar_errors("fuzz_safetensors", [&] {
    const dpar::io::SafetensorsContents contents = dpar::io::load_safetensors(path);
    // Touch every element: a tensor whose bytes were not all read would show up under ASan.
    unsigned sum = 0;
    for (const auto& [name, tensor] : contents.tensors) {
      const auto* bytes = static_cast<const uint8_t*>(tensor.raw_data());
      for (size_t i = 0; i < tensor.nbytes(); ++i) sum += bytes[i];
    }
    dpar::fuzz::keep(sum);
  });
  return 0;
}
