// The image decoders (stb_image: JPEG, PNG, BMP, GIF, ...) as ImageFolder calls them: bytes of a
// file, decoded, then the evaluation transform (resize + centre crop + normalise) at a small size.
#include <algorithm>

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
    constexpr int64_t kBudget = int64_t{1} << 22;
    dpar::data::Image image = dpar::data::decode_image(data, size, "fuzz.img", kBudget);
    // The same budget for the resized image: a 327683x2 BMP resized to a short side of 18 is
    // 2.9Mx18 = 53M pixels, within the transform's limit (kMaxImagePixels, 64M) and correct,
    // but 31 s of resampling under ASan + UBSan. Such images are skipped; thinner ones, whose
    // resize passes the limit and must be refused by Resize, still run.
    constexpr double kShortSide = 18;
    const double long_side =
        kShortSide * static_cast<double>(std::max(image.height, image.width)) /
        static_cast<double>(std::max<int64_t>(1, std::min(image.height, image.width)));
    const double resized = long_side * kShortSide;
    if (resized > static_cast<double>(kBudget) &&
        resized <= static_cast<double>(dpar::data::kMaxImagePixels)) {
      return;
    }
    static const dpar::data::Compose eval = dpar::data::imagenet_eval_transform(16, 18);
    dpar::Generator rng(1);
    (void)eval(std::move(image), rng);
  });
  return 0;
}
