// The idx reader as FashionMnist calls it: an images file (3-D) and a labels file (1-D) in one
// folder; the first two input bytes give the length of the images file. Every example the set
// reports is then fetched.
#include <filesystem>

#include "dpar/core/random.h"
#include "dpar/data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [images, labels] = dpar::fuzz::split_two(data, size);
  const auto put = [](const char* name, std::string_view bytes) {
    dpar::fuzz::write_scratch(name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  };
  put("t10k-images-idx3-ubyte", images);
  put("t10k-labels-idx1-ubyte", labels);
  dpar::fuzz::expect_only_dpar_errors("fuzz_idx", [&] {
    const dpar::data::FashionMnist set(dpar::fuzz::scratch_dir().string(), dpar::data::Split::Test);
    dpar::Generator rng(1);
    for (size_t i = 0; i < set.size() && i < 64; ++i) (void)set.get(i, rng);
  });
  return 0;
}
