// bf16 activations on the CPU under amp::Autocast(bf16): conv2d, linear and matmul compute on
// oneDNN's bf16 kernels (f32 accumulation) and return bf16; the ops between them read and write
// bf16 (tests/half_precision_checks.h, the same checks the GPU runs in f16 and bf16); the
// parameters' gradients stay f32. On a CPU without AVX-512 (no oneDNN bf16 kernels) the checks
// are skipped and the refusal is checked instead.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "half_precision_checks.h"
#include "helpers.h"

using namespace dpar;

namespace {

const std::vector<DType> kBf16 = {DType::bf16};
const Device kCpu = Device::cpu();

bool bf16_available() {
  if (amp::cpu_bf16_support() != amp::CpuBf16::unsupported) return true;
  std::printf("skipped: this CPU has no AVX-512, so no oneDNN bf16 kernels\n");
  return false;
}

// conv2d under autocast against f32 on the same (bf16-representable) values: the result in
// bf16, the gradients of the f32 leaves in f32 (the weight's and bias's computed by oneDNN in
// f32 from bf16 operands).
void check_conv(const Shape& x_shape, const Shape& w_shape, const Conv2dOptions& options, bool bias,
                uint64_t seed) {
  INFO("conv2d, seed " << seed << ", groups " << options.groups);
  auto leaf = [](const Tensor& t) { return leaf_on(half_checks::rounded(t, DType::bf16), kCpu); };
  Tensor x = leaf(random_tensor(x_shape, seed).contiguous(MemoryFormat::ChannelsLast));
  Tensor w = leaf(random_tensor(w_shape, seed + 1, -0.2f, 0.2f));
  Tensor b = bias ? leaf(random_tensor({w_shape[0]}, seed + 2)) : Tensor();
  const Tensor ref = conv2d(x, w, b, options);
  sum(mul(ref, ref)).backward();
  const Tensor ref_dx = x.grad().clone(), ref_dw = w.grad().clone();
  const Tensor ref_db = bias ? b.grad().clone() : Tensor();
  x.set_grad({});
  w.set_grad({});
  if (bias) b.set_grad({});
  Tensor y;
  {
    amp::Autocast autocast(DType::bf16);
    y = conv2d(x, w, b, options);
  }
  CHECK(y.dtype() == DType::bf16);
  CHECK(relative_error(ref, y) <= half_checks::tolerance(DType::bf16));
  sum(mul(y, y)).backward();
  CHECK(x.grad().dtype() == DType::f32);
  CHECK(w.grad().dtype() == DType::f32);
  CHECK(relative_error(ref_dx, x.grad()) <= 2 * half_checks::tolerance(DType::bf16));
  CHECK(relative_error(ref_dw, w.grad()) <= 2 * half_checks::tolerance(DType::bf16));
  if (bias) CHECK(relative_error(ref_db, b.grad()) <= 2 * half_checks::tolerance(DType::bf16));
}

}  // namespace

TEST_CASE("conv2d under bf16 autocast on the CPU: MobileNetV3's stem, depthwise and 1x1 shapes") {
  if (!bf16_available()) return;
  check_conv({4, 3, 16, 16}, {16, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, false, 41);
  check_conv({4, 16, 14, 14}, {16, 1, 5, 5}, {.stride = {2, 2}, .padding = {2, 2}, .groups = 16},
             false, 21);
  check_conv({4, 24, 10, 10}, {24, 1, 3, 3}, {.stride = {1, 1}, .padding = {1, 1}, .groups = 24},
             false, 31);
  check_conv({4, 16, 9, 9}, {24, 16, 1, 1}, {}, false, 11);
  // The SE block's 1x1 convolutions on [N, C, 1, 1], with a bias (kept in f32 by oneDNN).
  check_conv({4, 24, 1, 1}, {8, 24, 1, 1}, {}, true, 51);
}

TEST_CASE("linear and matmul under bf16 autocast on the CPU") {
  if (!bf16_available()) return;
  const double tol = half_checks::tolerance(DType::bf16);
  // The bias is an f32 parameter (linear takes no other): the bf16 run's is cast back to f32.
  auto linear_under_autocast = [](const std::vector<Tensor>& in) {
    const bool half = in[0].dtype() == DType::bf16;
    amp::Autocast autocast(DType::bf16, half);
    return linear(in[0], in[1], in.size() > 2 ? in[2].to(DType::f32) : Tensor());
  };
  const Tensor x = random_tensor({32, 64}, 4), w = random_tensor({24, 64}, 6);
  half_checks::half_matches_f32("linear", kCpu, DType::bf16, linear_under_autocast, {x, w});
  half_checks::half_matches_f32("linear with a bias", kCpu, DType::bf16, linear_under_autocast,
                                {x, w, random_tensor({24}, 7)});
  const Tensor a = random_tensor({8, 16, 32}, 8), m = random_tensor({32, 12}, 9);
  const Tensor want = matmul(a, m);
  amp::Autocast autocast(DType::bf16);
  const Tensor got = matmul(a, m);
  CHECK(got.dtype() == DType::bf16);
  CHECK(relative_error(want, got) <= tol);
  // A transposed operand (attention's k^T) and a batched product.
  const Tensor q = random_tensor({2, 4, 6, 8}, 10), k = random_tensor({2, 4, 6, 8}, 11);
  const Tensor scores = matmul(q, k.transpose(-2, -1));
  CHECK(scores.dtype() == DType::bf16);
  amp::Autocast off(DType::f32);
  CHECK(relative_error(matmul(q, k.transpose(-2, -1)), scores) <= tol);
}

TEST_CASE("adds and products in bf16 on the CPU match f32: same shapes, strided, SE broadcasts") {
  if (!bf16_available()) return;
  half_checks::check_adds_and_products(kCpu, kBf16);
}

TEST_CASE("activations and dropout in bf16 on the CPU match f32") {
  if (!bf16_available()) return;
  half_checks::check_activations(kCpu, kBf16);
}

TEST_CASE("BatchNorm with its activation on bf16 data on the CPU: f32 statistics and parameters") {
  if (!bf16_available()) return;
  half_checks::check_batch_norm(kCpu, kBf16);
}

TEST_CASE("BatchNorm's bf16 statistics keep their digits under a large mean, in both layouts") {
  if (!bf16_available()) return;
  // Values in [14, 18): a mean 8 standard deviations from zero, where E[x^2] - E[x]^2 in f32
  // would lose the variance's leading digits.
  const Tensor x = random_tensor({4, 24, 9, 9}, 61, 14.f, 18.f);
  for (bool channels_last : {true, false}) {
    Tensor rm = Tensor::zeros({24}), rv = Tensor::ones({24});
    half_checks::half_matches_f32(
        "batch_norm", kCpu, DType::bf16,
        [&](const auto& in) {
          return batch_norm(in[0], Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5);
        },
        {x}, channels_last);
  }
}

TEST_CASE("BatchNorm on bf16 in eval mode, and with a zero weight (backward from its input)") {
  if (!bf16_available()) return;
  const Tensor x = random_tensor({4, 40, 7, 7}, 62, -2.f, 3.f);
  const Tensor running_mean = random_tensor({40}, 63, -0.5f, 0.5f);
  const Tensor running_var = random_tensor({40}, 64, 0.5f, 2.f);
  // Running statistics: y = (x - mean) / sqrt(var + eps) * w + b, the backward a per-channel
  // scale.
  const Tensor w = random_tensor({40}, 65, 0.2f, 0.6f), b = random_tensor({40}, 66);
  half_checks::half_matches_f32(
      "batch_norm eval", kCpu, DType::bf16,
      [&](const auto& in) {
        return batch_norm_act(in[0], w, b, running_mean.clone(), running_var.clone(), false, 0.1,
                              1e-5, Activation::relu);
      },
      {x}, true);
  // A weight of zero cannot be divided by, so the backward keeps the input (oneDNN's kernel on
  // bf16 data) instead of starting from the output.
  std::vector<float> with_zero = w.to_float_vector();
  with_zero[3] = 0.f;
  const Tensor wz = Tensor::from_vector(with_zero, {40});
  half_checks::half_matches_f32(
      "batch_norm, a zero weight", kCpu, DType::bf16,
      [&](const auto& in) {
        return batch_norm_act(in[0], wz, b, Tensor::zeros({40}), Tensor::ones({40}), true, 0.1,
                              1e-5, Activation::hardswish);
      },
      {x}, true);
}

TEST_CASE("global average pooling in bf16 on the CPU matches f32 in both layouts") {
  if (!bf16_available()) return;
  half_checks::check_global_pooling(kCpu, kBf16);
}

TEST_CASE("the dtypes between ops under bf16 autocast on the CPU") {
  if (!bf16_available()) return;
  half_checks::check_dtypes_between_ops(kCpu, kBf16);
}

TEST_CASE("mobilenet_v3_small: one CPU training step under bf16 autocast is close to f32") {
  if (!bf16_available()) return;
  half_checks::check_mobilenet_step(kCpu, kBf16);
}

TEST_CASE("Autocast(f16) leaves CPU ops in f32, bit for bit") {
  const Tensor a = random_tensor({8, 16}, 8), m = random_tensor({16, 4}, 9);
  const Tensor x = random_tensor({2, 3, 8, 8}, 10), w = random_tensor({4, 3, 3, 3}, 11);
  const Tensor want_mm = matmul(a, m), want_conv = conv2d(x, w);
  amp::Autocast autocast(DType::f16);
  const Tensor mm = matmul(a, m), conv = conv2d(x, w);
  CHECK(mm.dtype() == DType::f32);
  CHECK(conv.dtype() == DType::f32);
  CHECK(relative_error(want_mm, mm) == 0.0);
  CHECK(relative_error(want_conv, conv) == 0.0);
}

// Run by the next test in a child process whose oneDNN is capped below AVX-512 (hidden: not
// discovered on its own).
TEST_CASE("without AVX-512, CPU ops under Autocast(bf16) fail with one clear error", "[.capped]") {
  REQUIRE(amp::cpu_bf16_support() == amp::CpuBf16::unsupported);
  const Tensor x = random_tensor({2, 3, 8, 8}, 1), w = random_tensor({4, 3, 3, 3}, 2);
  amp::Autocast autocast(DType::bf16);
  CHECK_THAT(error_of([&] { conv2d(x, w); }),
             Catch::Contains("amp::Autocast(bf16): CPU ops in bf16 need AVX-512 (oneDNN's bf16 "
                             "kernels), which oneDNN does not find on this CPU"));
}

TEST_CASE("a CPU without AVX-512 refuses bf16 autocast (oneDNN capped at AVX2)") {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = 0;
  const std::string run =
      "ONEDNN_MAX_CPU_ISA=AVX2 '" + std::string(self) + "' '[.capped]' > /dev/null 2>&1";
  CHECK(std::system(run.c_str()) == 0);
}
