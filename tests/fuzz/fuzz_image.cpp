// The image decoders (stb_image: JPEG, PNG, BMP, GIF, ...) as ImageFolder calls them: bytes of a
// file, decoded, then the evaluation transform (resize + centre crop + normalise) at a small size.
#include "dpar/core/random.h"
#include "dpar/data/image.h"
#include "dpar/data/transforms.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpar::fuzz::expect_only_dpar_errors("fuzz_image", [&] {
    // 4M pixels, not the default 64M: stb under ASan + UBSan decodes a 30M-pixel JPEG that a
    // 733-byte input claims in 11 s, past the fuzzer's 10 s timeout (0.3 s in a release
    // build). Every decoder path stays reachable, and a thin image still gets resized far past
    // the transform's own limit.
    dpar::data::Image image = dpar::data::decode_image(data, size, "fuzz.img", int64_t{1} << 22);
    static const dpar::data::Compose eval = dpar::data::imagenet_eval_transform(16, 18);
    dpar::Generator rng(1);
    (void)eval(std::move(image), rng);
  });
  return 0;
}
