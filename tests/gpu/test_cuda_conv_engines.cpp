// Every cuDNN engine the graph API's search may pick, held to the CPU's convolution: for each
// of MobileNetV3-small's cuDNN problems (the stem and the depthwise convolutions, batch 8 at
// 64 px, channels-last with NHWC filters, as the model runs them; pointwise convolutions go to
// cuBLAS) and each direction, every candidate engine runs once (cuda::sweep_conv_engines) and
// its result must match the CPU's to 1e-4 relative in f32 (TF32 engines are left out, as in
// the search). A timed search picks whichever is fastest on the day, so each must be right.
// The table of every engine's error is printed: on the H200 a training comparison once failed
// when the stem's forward pass took engine 28 (docs/gpu.md).
#include <cstdio>

#include "gpu/gpu_helpers.h"
#include "tensor/conv_layout.h"
#include "tensor/cuda/conv_graph.h"

using namespace dpar;

namespace {

struct Problem {
  int64_t N, C, H, W, O, k, stride, groups;
};

kernels::Conv2dGeometry geometry(const Problem& p) {
  kernels::Conv2dGeometry g;
  g.N = p.N;
  g.C = p.C;
  g.H = p.H;
  g.W = p.W;
  g.O = p.O;
  g.kH = g.kW = p.k;
  g.stride[0] = g.stride[1] = p.stride;
  g.padding[0] = g.padding[1] = p.k / 2;
  g.groups = p.groups;
  g.OH = (p.H + 2 * (p.k / 2) - p.k) / p.stride + 1;
  g.OW = (p.W + 2 * (p.k / 2) - p.k) / p.stride + 1;
  return g;
}

cuda::ConvLayout nhwc_layout(const Tensor& activation, const Tensor& output) {
  return {detail::cudnn_activation_strides(activation, true),
          detail::cudnn_activation_strides(output, true), true};
}

// Runs every engine of one direction; checks and prints each one's error against want.
void check_engines(const char* what, cuda::ConvDirection direction,
                   const kernels::Conv2dGeometry& g, const Tensor& x, const Tensor& w,
                   const Tensor& y, const Tensor& result, const Tensor& want) {
  int engines = 0;
  cuda::sweep_conv_engines(direction, g, nhwc_layout(x, y), x, w, y,
                           [&](int64_t engine, const std::string& notes) {
                             const double error = relative_error(want, result);
                             std::printf("  %-22s engine %3lld (%s): %.2e\n", what,
                                         static_cast<long long>(engine), notes.c_str(), error);
                             INFO(what << ": engine " << engine << " (notes " << notes << ")");
                             CHECK(error <= 1e-4);
                             ++engines;
                           });
  std::printf("  %-22s %d engines ran\n", what, engines);
}

}  // namespace

TEST_CASE("every cuDNN engine the search may pick matches the CPU on MobileNetV3's problems") {
  DPAR_REQUIRE_GPU();
  const std::vector<Problem> problems = {
      {8, 3, 64, 64, 16, 3, 2, 1},    {8, 16, 32, 32, 16, 3, 2, 16}, {8, 72, 16, 16, 72, 3, 2, 72},
      {8, 88, 8, 8, 88, 3, 1, 88},    {8, 96, 8, 8, 96, 5, 2, 96},   {8, 240, 4, 4, 240, 5, 1, 240},
      {8, 288, 4, 4, 288, 5, 2, 288}, {8, 576, 2, 2, 576, 5, 1, 576}};
  uint64_t seed = 1;
  for (const Problem& p : problems) {
    const kernels::Conv2dGeometry g = geometry(p);
    std::printf("f32 [%lld,%lld,%lld,%lld] -> %lld k%lld s%lld g%lld\n",
                static_cast<long long>(p.N), static_cast<long long>(p.C),
                static_cast<long long>(p.H), static_cast<long long>(p.W),
                static_cast<long long>(p.O), static_cast<long long>(p.k),
                static_cast<long long>(p.stride), static_cast<long long>(p.groups));
    INFO("problem [" << p.N << "," << p.C << "," << p.H << "," << p.W << "] -> " << p.O << " k"
                     << p.k << " s" << p.stride << " g" << p.groups);
    // The CPU's results: y, and the gradients of sum(y * dy).
    Tensor x = leaf_on(random_tensor({p.N, p.C, p.H, p.W}, seed++), Device::cpu());
    Tensor w =
        leaf_on(random_tensor({p.O, p.C / p.groups, p.k, p.k}, seed++, -0.3f, 0.3f), Device::cpu());
    const Conv2dOptions options{
        .stride = {p.stride, p.stride}, .padding = {p.k / 2, p.k / 2}, .groups = p.groups};
    const Tensor y_want = conv2d(x, w, Tensor(), options);
    const Tensor dy = random_tensor(y_want.shape(), seed++);
    sum(mul(y_want, dy)).backward();

    const auto on_gpu = [](const Tensor& t) {
      return t.detach().to(kGpu).contiguous(MemoryFormat::ChannelsLast);
    };
    const Tensor xg = on_gpu(x), wg = on_gpu(w), dyg = on_gpu(dy);
    const Tensor yg = Tensor::empty(y_want.shape(), DType::f32, kGpu, MemoryFormat::ChannelsLast);
    const Tensor dxg = Tensor::empty(x.shape(), DType::f32, kGpu, MemoryFormat::ChannelsLast);
    const Tensor dwg = Tensor::empty(w.shape(), DType::f32, kGpu, MemoryFormat::ChannelsLast);
    check_engines("the forward pass", cuda::ConvDirection::Forward, g, xg, wg, yg, yg, y_want);
    check_engines("the input gradient", cuda::ConvDirection::BackwardData, g, dxg, wg, dyg, dxg,
                  x.grad());
    check_engines("the weight gradient", cuda::ConvDirection::BackwardFilter, g, xg, dwg, dyg, dwg,
                  w.grad());
  }
}
