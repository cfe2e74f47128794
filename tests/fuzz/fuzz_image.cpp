// The image decoders (stb_image: JPEG, PNG, BMP, GIF, ...) as ImageFolder calls them: bytes of a
// file, decoded, then the evaluation transform (resize + centre crop + normalise) at a small size.
#include "dpar/core/random.h"
#include "dpar/data/image.h"
#include "dpar/data/transforms.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpar::fuzz::expect_only_dpar_errors("fuzz_image", [&] {
    dpar::data::Image image = dpar::data::decode_image(data, size, "fuzz.img");
    static const dpar::data::Compose eval = dpar::data::imagenet_eval_transform(16, 18);
    dpar::Generator rng(1);
    (void)eval(std::move(image), rng);
  });
  return 0;
}
