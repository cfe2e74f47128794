// Mixed precision on the GPU: conv2d/linear/matmul under amp::Autocast compute in f16/bf16 and
// return results in that dtype close to the f32 result (forward and backward; an f32 input's
// gradient comes back in f32); a small CNN's loss falls over 200
// AMP steps in both dtypes; the fp16 loss scaler skips a step whose gradients hold an inf.
#include "gpu/gpu_helpers.h"

using namespace dpar;

namespace {

// Stated bounds (relative to the largest magnitude): f16 keeps 11 bits of mantissa, bf16 8;
// products accumulate in f32, so the inputs' rounding dominates.
double bound(DType dtype) { return dtype == DType::f16 ? 5e-3 : 4e-2; }

std::shared_ptr<nn::Sequential> small_cnn() {
  manual_seed(5);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(3, 16, 3, 1, 1));
  net->push_back(std::make_shared<nn::BatchNorm2d>(16));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Conv2d>(16, 32, 3, 2, 1));
  net->push_back(std::make_shared<nn::BatchNorm2d>(32));
  net->push_back(std::make_shared<nn::Hardswish>());
  net->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  net->push_back(std::make_shared<nn::Flatten>(1));
  net->push_back(std::make_shared<nn::Linear>(32, 4));
  return net;
}

// A learnable synthetic task: the label is the brightest of the first 4 "quadrant" patterns.
std::pair<Tensor, Tensor> synthetic_batch(uint64_t seed, int64_t n) {
  Generator gen(seed);
  std::vector<float> x(static_cast<size_t>(n * 3 * 16 * 16));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = static_cast<int64_t>(gen.next_u64() % 4);
    y[static_cast<size_t>(i)] = label;
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t h = 0; h < 16; ++h) {
        for (int64_t w = 0; w < 16; ++w) {
          const int64_t quadrant = (h >= 8) * 2 + (w >= 8);
          const float signal = quadrant == label ? 1.5f : 0.f;
          x[static_cast<size_t>(((i * 3 + c) * 16 + h) * 16 + w)] = signal + 0.5f * gen.normal();
        }
      }
    }
  }
  return {Tensor::from_vector(x, {n, 3, 16, 16}).to(kGpu), Tensor::from_vector(y, {n}).to(kGpu)};
}

// conv2d of x [x_shape] with w [w_shape] and a bias under autocast against f32, forward and
// backward (the backward runs in dtype outside the autocast scope too).
void check_conv_under_autocast(DType dtype, const Shape& x_shape, const Shape& w_shape,
                               const Conv2dOptions& options, bool channels_last, uint64_t seed) {
  INFO("conv2d x " << shape_str(x_shape) << " w " << shape_str(w_shape) << " channels-last "
                   << channels_last);
  Tensor x0 = random_tensor(x_shape, seed);
  if (channels_last) x0 = x0.contiguous(MemoryFormat::ChannelsLast);
  Tensor x = leaf_on(x0, kGpu);
  Tensor w = leaf_on(random_tensor(w_shape, seed + 1, -0.2f, 0.2f), kGpu);
  Tensor b = leaf_on(random_tensor({w_shape[0]}, seed + 2), kGpu);
  const Tensor ref = conv2d(x, w, b, options);
  sum(mul(ref, ref)).backward();
  const Tensor ref_dx = x.grad().clone(), ref_dw = w.grad().clone(), ref_db = b.grad().clone();
  x.set_grad({});
  w.set_grad({});
  b.set_grad({});
  Tensor y;
  {
    amp::Autocast autocast(dtype);
    y = conv2d(x, w, b, options);
  }
  CHECK(y.dtype() == dtype);  // the activations stay in the half type (torch.autocast's rule)
  CHECK(relative_error(ref, y) <= bound(dtype));
  sum(mul(y, y)).backward();
  CHECK(x.grad().dtype() == DType::f32);
  CHECK(relative_error(ref_dx, x.grad()) <= 2 * bound(dtype));
  CHECK(relative_error(ref_dw, w.grad()) <= 2 * bound(dtype));
  CHECK(relative_error(ref_db, b.grad()) <= 2 * bound(dtype));
}

}  // namespace

TEST_CASE("conv2d, linear and matmul under autocast match f32 within the dtype's precision") {
  DPAR_REQUIRE_GPU();
  for (DType dtype : {DType::f16, DType::bf16}) {
    INFO(dtype_name(dtype));
    check_conv_under_autocast(dtype, {4, 8, 12, 12}, {16, 8, 3, 3},
                              {.stride = {2, 2}, .padding = {1, 1}}, false, 1);
    // A pointwise (1x1) convolution: on the GPU a matrix product (DPAR_CONV_GEMM).
    check_conv_under_autocast(dtype, {4, 16, 9, 9}, {24, 16, 1, 1}, {}, true, 11);
    // MobileNetV3's depthwise and stem convolutions, channels-last as the model runs them.
    check_conv_under_autocast(dtype, {4, 16, 14, 14}, {16, 1, 5, 5},
                              {.stride = {2, 2}, .padding = {2, 2}, .groups = 16}, true, 21);
    check_conv_under_autocast(dtype, {4, 24, 10, 10}, {24, 1, 3, 3},
                              {.stride = {1, 1}, .padding = {1, 1}, .groups = 24}, true, 31);
    check_conv_under_autocast(dtype, {4, 3, 16, 16}, {16, 3, 3, 3},
                              {.stride = {2, 2}, .padding = {1, 1}}, true, 41);

    const Tensor a = random_tensor({32, 64}, 4).to(kGpu), m = random_tensor({64, 24}, 5).to(kGpu);
    const Tensor lw = random_tensor({24, 64}, 6).to(kGpu), lb = random_tensor({24}, 7).to(kGpu);
    const Tensor mm = matmul(a, m), lin = linear(a, lw, lb);
    amp::Autocast autocast(dtype);
    CHECK(relative_error(mm, matmul(a, m)) <= bound(dtype));
    CHECK(relative_error(lin, linear(a, lw, lb)) <= bound(dtype));
  }
  // CPU tensors are unaffected: bitwise the f32 result.
  const Tensor a = random_tensor({8, 16}, 8), m = random_tensor({16, 4}, 9);
  const Tensor want = matmul(a, m);
  amp::Autocast autocast(DType::f16);
  CHECK(relative_error(want, matmul(a, m)) == 0.0);
}

TEST_CASE("a small CNN learns with AMP in fp16 and bf16 over 200 steps") {
  DPAR_REQUIRE_GPU();
  for (DType dtype : {DType::f16, DType::bf16}) {
    INFO(dtype_name(dtype));
    auto net = small_cnn();
    net->to(kGpu);
    net->train();
    optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
    amp::GradScaler scaler({.enabled = dtype == DType::f16});
    double first = 0, last = 0;
    for (int step = 0; step < 200; ++step) {
      auto [x, y] = synthetic_batch(100 + static_cast<uint64_t>(step), 32);
      opt.zero_grad();
      Tensor loss;
      {
        amp::Autocast autocast(dtype);
        loss = cross_entropy(net->forward(x), y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      const double value = loss.item();
      REQUIRE(std::isfinite(value));
      if (step < 10) first += value / 10;
      if (step >= 190) last += value / 10;
    }
    std::printf("%s: loss %.4f over the first 10 steps, %.4f over the last 10, %lld skipped\n",
                dtype_name(dtype).data(), first, last,
                static_cast<long long>(scaler.skipped_steps()));
    CHECK(last < 0.5 * first);
  }
}

TEST_CASE("the fp16 loss scaler skips a step with an injected inf and halves the scale") {
  DPAR_REQUIRE_GPU();
  auto net = small_cnn();
  net->to(kGpu);
  optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  amp::GradScaler scaler;
  auto [x, y] = synthetic_batch(7, 16);
  Tensor loss;
  {
    amp::Autocast autocast(DType::f16);
    loss = cross_entropy(net->forward(x), y);
  }
  scaler.scale(loss).backward();
  // The first element of the first weight's gradient (channels-last on the GPU, so sliced
  // rather than flattened).
  Tensor g = net->parameters()[0].grad();
  g.slice(0, 0, 1).slice(1, 0, 1).slice(2, 0, 1).slice(3, 0, 1).fill_(
      std::numeric_limits<double>::infinity());
  const std::vector<float> before = net->parameters()[0].to_float_vector();
  const double scale = scaler.get_scale();
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.skipped_steps() == 1);
  CHECK(scaler.get_scale() == scale / 2);
  CHECK(net->parameters()[0].to_float_vector() == before);
}
