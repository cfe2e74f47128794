#include <array>
#include <catch2/catch.hpp>
#include <cstring>

#include "gradcheck.h"
#include "tensor/conv_layout.h"
#include "tensor_compare.h"

using namespace dpar;
using dpar::testing::gradcheck;
using dpar::testing::max_rel_error;
using dpar::testing::random_tensor;

namespace {

struct ConvCase {
  const char* name;
  Shape x;  // [N,C,H,W]
  Shape w;  // [O,C/g,kH,kW]
  Conv2dOptions opt;
  bool bias;
  MemoryFormat format;
};

// Direct loops over PyTorch's definition: visit(x_index, w_index, y_index) for every product
// of the convolution, the indices in logical NCHW (x, y) and OIHW (w) order, each output's
// products in input-channel, then kernel-row, then kernel-column order.
template <typename Visit>
void for_each_product(const Shape& xs, const Shape& ws, Conv2dOptions o, const Shape& out,
                      Visit visit) {
  for (auto* v : {&o.stride, &o.padding, &o.dilation}) {
    if (v->size() == 1) v->push_back(v->front());
  }
  const int64_t C = xs[1], H = xs[2], W = xs[3];
  const int64_t O = ws[0], Cg = ws[1], kH = ws[2], kW = ws[3];
  const int64_t Og = O / o.groups;
  size_t i = 0;
  for (int64_t n = 0; n < out[0]; ++n)
    for (int64_t oc = 0; oc < O; ++oc)
      for (int64_t oh = 0; oh < out[2]; ++oh)
        for (int64_t ow = 0; ow < out[3]; ++ow, ++i) {
          const int64_t grp = oc / Og;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t kh = 0; kh < kH; ++kh)
              for (int64_t kw = 0; kw < kW; ++kw) {
                const int64_t ih = oh * o.stride[0] - o.padding[0] + kh * o.dilation[0];
                const int64_t iw = ow * o.stride[1] - o.padding[1] + kw * o.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t c = grp * Cg + ci;
                visit(static_cast<size_t>(((n * C + c) * H + ih) * W + iw),
                      static_cast<size_t>(((oc * Cg + ci) * kH + kh) * kW + kw), i);
              }
        }
}

std::vector<float> to_floats(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

std::vector<float> reference_conv(const Tensor& x, const Tensor& w, const Tensor& b,
                                  const Conv2dOptions& o, const Shape& out) {
  const std::vector<float> xv = x.to_float_vector(), wv = w.to_float_vector();
  const std::vector<float> bv = b.defined() ? b.to_float_vector() : std::vector<float>();
  const int64_t plane = out[2] * out[3];
  std::vector<double> y(static_cast<size_t>(shape_numel(out)));
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] = bv.empty() ? 0.0 : bv[(i / static_cast<size_t>(plane)) % bv.size()];
  }
  for_each_product(x.shape(), w.shape(), o, out, [&](size_t xi, size_t wi, size_t yi) {
    y[yi] += static_cast<double>(xv[xi]) * wv[wi];
  });
  return to_floats(y);
}

// The gradients of sum(conv2d(x, w) * dy) with respect to x and w, summed in double.
std::pair<std::vector<float>, std::vector<float>> reference_conv_grads(const Tensor& x,
                                                                       const Tensor& w,
                                                                       const Tensor& dy,
                                                                       const Conv2dOptions& o) {
  const std::vector<float> xv = x.to_float_vector(), wv = w.to_float_vector();
  const std::vector<float> dyv = dy.to_float_vector();
  std::vector<double> dx(xv.size()), dw(wv.size());
  for_each_product(x.shape(), w.shape(), o, dy.shape(), [&](size_t xi, size_t wi, size_t yi) {
    dx[xi] += static_cast<double>(dyv[yi]) * wv[wi];
    dw[wi] += static_cast<double>(dyv[yi]) * xv[xi];
  });
  return {to_floats(dx), to_floats(dw)};
}

Conv2dOptions opts(std::vector<int64_t> stride, std::vector<int64_t> padding,
                   std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1) {
  Conv2dOptions o;
  o.stride = std::move(stride);
  o.padding = std::move(padding);
  o.dilation = std::move(dilation);
  o.groups = groups;
  return o;
}

}  // namespace

TEST_CASE("conv2d matches direct convolution and finite differences", "[conv]") {
  const MemoryFormat CL = MemoryFormat::ChannelsLast, NCHW = MemoryFormat::Contiguous;
  const std::vector<ConvCase> cases = {
      {"3x3 s1 p1 bias", {2, 3, 5, 4}, {4, 3, 3, 3}, opts({1, 1}, {1, 1}), true, CL},
      {"3x3 s2 p1", {1, 4, 7, 6}, {3, 4, 3, 3}, opts({2, 2}, {1, 1}), false, NCHW},
      {"1x1 bias", {2, 5, 3, 3}, {6, 5, 1, 1}, opts({1, 1}, {0, 0}), true, CL},
      {"1x1 nchw", {2, 5, 3, 2}, {4, 5, 1, 1}, opts({1, 1}, {0, 0}), false, NCHW},
      // 24 or more input channels without a bias: the weight gradient is one sgemm.
      {"1x1 26 channels", {2, 26, 3, 2}, {7, 26, 1, 1}, opts({1, 1}, {0, 0}), false, CL},
      {"depthwise 5x5 s2 p2",
       {1, 4, 9, 8},
       {4, 1, 5, 5},
       opts({2, 2}, {2, 2}, {1, 1}, 4),
       false,
       CL},
      {"depthwise x2 3x3 bias",
       {1, 3, 5, 5},
       {6, 1, 3, 3},
       opts({1, 1}, {1, 1}, {1, 1}, 3),
       true,
       NCHW},
      // Channel counts that cover the 16- and 8-wide blocks and single-channel tails of the
      // depthwise weight-gradient kernel.
      {"depthwise 5x5 27 channels bias",
       {1, 27, 5, 4},
       {27, 1, 5, 5},
       opts({1, 1}, {2, 2}, {1, 1}, 27),
       true,
       CL},
      // 5x5 and larger, stride 1, "same" padding: the input gradient runs as a forward
      // convolution with the flipped filter (as in the 5x5 27-channel case above).
      {"depthwise 7x7 s1 p3 8 channels",
       {2, 8, 7, 8},
       {8, 1, 7, 7},
       opts({1, 1}, {3, 3}, {1, 1}, 8),
       false,
       CL},
      {"depthwise 7x7 s2 19 channels",
       {1, 19, 8, 7},
       {19, 1, 7, 7},
       opts({2, 2}, {3, 3}, {1, 1}, 19),
       false,
       CL},
      {"depthwise 5x5 dilation 2 s2 24 channels",
       {2, 24, 9, 8},
       {24, 1, 5, 5},
       opts({2, 2}, {4, 1}, {2, 2}, 24),
       false,
       NCHW},
      // 3x3 depthwise weight gradients run image by image over all channels (f32): 8-wide
      // vectors and a tail of 3 channels, taps cut by the padding on both sides, a dilated one.
      {"depthwise 3x3 s2 p1 11 channels bias",
       {3, 11, 9, 8},
       {11, 1, 3, 3},
       opts({2, 2}, {1, 1}, {1, 1}, 11),
       true,
       CL},
      // 3x3 stride 2 from 32 channels: dpar's own forward and input gradient (4 vectors and a
      // tail of 1; an odd and an even width).
      {"depthwise 3x3 s2 p1 33 channels bias",
       {2, 33, 5, 6},
       {33, 1, 3, 3},
       opts({2, 2}, {1, 1}, {1, 1}, 33),
       true,
       CL},
      {"depthwise 3x3 s1 p2 dilation 2 16 channels",
       {2, 16, 7, 9},
       {16, 1, 3, 3},
       opts({1, 1}, {2, 2}, {2, 2}, 16),
       false,
       NCHW},
      {"groups 2 bias", {1, 4, 5, 5}, {6, 2, 3, 3}, opts({1, 1}, {1, 1}, {1, 1}, 2), true, NCHW},
      {"dilation 2", {1, 2, 7, 6}, {3, 2, 3, 3}, opts({1, 1}, {2, 2}, {2, 2}), true, CL},
      {"3x1 kernel, stride (2,1), pad (1,0)",
       {2, 2, 6, 3},
       {3, 2, 3, 1},
       opts({2, 1}, {1, 0}),
       true,
       CL},
      {"floor output size s2 no pad", {1, 2, 6, 5}, {2, 2, 3, 3}, opts({2}, {0}), false, CL},
      // At most 4 input channels into 8, 16 or 32 without a bias, channels-last: dpar's own
      // weight gradient (few_channel_conv_kernels.cpp). Rows and columns in the padding on
      // both sides, more than one block of rows and of taps, and a remainder of each.
      {"stem 3 -> 16 3x3 s2 p1", {2, 3, 37, 29}, {16, 3, 3, 3}, opts({2, 2}, {1, 1}), false, CL},
      {"stem 3 -> 8 3x3 s1 p1", {1, 3, 9, 28}, {8, 3, 3, 3}, opts({1, 1}, {1, 1}), false, CL},
      {"stem 4 -> 32 5x3 s(1,2) p(2,1)",
       {2, 4, 9, 11},
       {32, 4, 5, 3},
       opts({1, 2}, {2, 1}),
       false,
       CL},
      {"stem 1 -> 16 7x7 s2 p3, wider than the input",
       {1, 1, 5, 4},
       {16, 1, 7, 7},
       opts({2, 2}, {3, 3}),
       false,
       CL},
  };
  Generator gen(21);
  for (const ConvCase& c : cases) {
    SECTION(c.name) {
      Tensor x = random_tensor(c.x, gen, -1, 1, c.format).set_requires_grad();
      Tensor w = random_tensor(c.w, gen).set_requires_grad();
      Tensor b = c.bias ? random_tensor({c.w[0]}, gen).set_requires_grad() : Tensor();

      const Tensor y = conv2d(x, w, b, c.opt);
      CHECK(y.is_contiguous(MemoryFormat::ChannelsLast));
      CHECK(max_rel_error(y.to_float_vector(), reference_conv(x, w, b, c.opt, y.shape()), 0.1) <
            1e-4);

      const std::vector<Tensor> inputs =
          c.bias ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
      gradcheck(
          [&](const std::vector<Tensor>& in) {
            return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), c.opt);
          },
          inputs);
    }
  }
}

// test_cuda_conv_engines holds every engine cuDNN's search may pick to these CPU results
// (1e-4 relative, its inputs NCHW as here): MobileNetV3-small's stem and depthwise problems at
// batch 8 and 64 px, each direction. They must be right well within that, in both layouts;
// some of them (2x2 maps under a 5x5 kernel) run dpar's own kernels nowhere else.
TEST_CASE("MobileNetV3-small's cuDNN problems: conv2d and its gradients match direct sums",
          "[conv]") {
  struct Problem {
    int64_t N, C, H, W, O, k, stride, groups;
  };
  const std::vector<Problem> problems = {
      {8, 3, 64, 64, 16, 3, 2, 1},    {8, 16, 32, 32, 16, 3, 2, 16}, {8, 72, 16, 16, 72, 3, 2, 72},
      {8, 88, 8, 8, 88, 3, 1, 88},    {8, 96, 8, 8, 96, 5, 2, 96},   {8, 240, 4, 4, 240, 5, 1, 240},
      {8, 288, 4, 4, 288, 5, 2, 288}, {8, 576, 2, 2, 576, 5, 1, 576}};
  // The GPU test's measure, max |got - want| / max |want|.
  auto error = [](const Tensor& got, const std::vector<float>& want) {
    return relative_error(Tensor::from_vector(want, got.shape()), got);
  };
  Generator gen(8);
  for (const Problem& p : problems) {
    for (const MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      INFO("[" << p.N << "," << p.C << "," << p.H << "," << p.W << "] -> " << p.O << " k" << p.k
               << " s" << p.stride << " g" << p.groups
               << (format == MemoryFormat::ChannelsLast ? " channels-last" : " NCHW"));
      const Conv2dOptions o = opts({p.stride, p.stride}, {p.k / 2, p.k / 2}, {1, 1}, p.groups);
      Tensor x = random_tensor({p.N, p.C, p.H, p.W}, gen, -1, 1, format).set_requires_grad();
      Tensor w =
          random_tensor({p.O, p.C / p.groups, p.k, p.k}, gen, -0.3f, 0.3f).set_requires_grad();
      const Tensor y = conv2d(x, w, Tensor(), o);
      const Tensor dy = random_tensor(y.shape(), gen);
      sum(mul(y, dy)).backward();
      const auto [dx_want, dw_want] = reference_conv_grads(x, w, dy, o);
      CHECK(error(y, reference_conv(x, w, Tensor(), o, y.shape())) < 1e-5);
      CHECK(error(x.grad(), dx_want) < 1e-5);
      CHECK(error(w.grad(), dw_want) < 1e-5);
    }
  }
}

TEST_CASE("conv2d skips the input gradient when the input needs none", "[conv]") {
  Generator gen(22);
  Tensor x = random_tensor({2, 3, 6, 6}, gen);  // an image batch: no grad
  Tensor w = random_tensor({4, 3, 3, 3}, gen).set_requires_grad();
  Tensor b = random_tensor({4}, gen).set_requires_grad();
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0], in[1], in[2], opts({2, 2}, {1, 1}));
      },
      {x, w, b});
  CHECK_FALSE(x.grad().defined());
  CHECK(w.grad().is_contiguous());
  CHECK(w.grad().shape() == Shape{4, 3, 3, 3});
}

TEST_CASE("conv2d accepts strided (non-dense) inputs and weights", "[conv]") {
  Generator gen(23);
  Tensor big = random_tensor({2, 3, 8, 10}, gen);
  Tensor x = big.slice(3, 1, 9, 2);  // [2,3,8,4], non-dense
  Tensor wt = random_tensor({3, 4, 3, 3}, gen);
  Tensor w = wt.transpose(0, 1);  // [4,3,3,3], not contiguous
  const Tensor y = conv2d(x, w, {}, opts({1, 1}, {1, 1}));
  CHECK(max_rel_error(y.to_float_vector(),
                      reference_conv(x, w, {}, opts({1, 1}, {1, 1}), y.shape())) < 1e-4);
}

TEST_CASE("conv2d and batch_norm on an empty batch", "[conv]") {
  Tensor x = Tensor::zeros({0, 3, 5, 5}).set_requires_grad();
  Tensor w = Tensor::ones({4, 3, 3, 3}).set_requires_grad();
  Tensor b = Tensor::ones({4}).set_requires_grad();
  Tensor y = conv2d(x, w, b, opts({2, 2}, {1, 1}));
  CHECK(y.shape() == Shape{0, 4, 3, 3});
  Tensor rm = Tensor::zeros({4}), rv = Tensor::ones({4});
  sum(batch_norm(y, b, b, rm, rv, false, 0.1, 1e-5)).backward();
  CHECK(x.grad().shape() == Shape{0, 3, 5, 5});
  CHECK(w.grad().to_float_vector() == std::vector<float>(4 * 3 * 3 * 3, 0.f));
  CHECK(b.grad().to_float_vector() == std::vector<float>(4, 0.f));
}

TEST_CASE("conv2d is deterministic", "[conv]") {
  Generator gen(24);
  Tensor x =
      random_tensor({4, 8, 10, 10}, gen, -1, 1, MemoryFormat::ChannelsLast).set_requires_grad();
  Tensor w = random_tensor({8, 1, 5, 5}, gen).set_requires_grad();
  auto run = [&] {
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    Tensor y = conv2d(x, w, {}, opts({2, 2}, {2, 2}, {1, 1}, 8));
    sum(mul(y, y)).backward();
    std::vector<float> out = y.to_float_vector();
    for (float v : x.grad().to_float_vector()) out.push_back(v);
    for (float v : w.grad().to_float_vector()) out.push_back(v);
    return out;
  };
  const std::vector<float> a = run(), b = run();
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("conv2d argument errors name the op and shapes", "[conv]") {
  Tensor x = Tensor::zeros({1, 4, 5, 5});
  Tensor w = Tensor::zeros({6, 4, 3, 3});
  using Catch::Contains;
  CHECK_THROWS_WITH(conv2d(Tensor::zeros({4, 5, 5}), w),
                    Contains("conv2d") && Contains("4-D input") && Contains("[4,5,5]"));
  CHECK_THROWS_WITH(conv2d(x, Tensor::zeros({6, 4, 3})), Contains("conv2d") && Contains("[6,4,3]"));
  CHECK_THROWS_WITH(conv2d(x, Tensor::zeros({6, 3, 3, 3})),
                    Contains("conv2d") && Contains("[1,4,5,5]") && Contains("[6,3,3,3]"));
  CHECK_THROWS_WITH(conv2d(x, Tensor::zeros({6, 2, 3, 3}), {}, opts({1, 1}, {0, 0}, {1, 1}, 3)),
                    Contains("conv2d: groups 3 does not divide") && Contains("[1,4,5,5]"));
  CHECK_THROWS_WITH(conv2d(x, Tensor::zeros({5, 2, 3, 3}), {}, opts({1, 1}, {0, 0}, {1, 1}, 2)),
                    Contains("conv2d: groups 2 does not divide the 5 output channels"));
  CHECK_THROWS_WITH(conv2d(x, Tensor::zeros({6, 4, 7, 7})),
                    Contains("conv2d: kernel [7,7]") && Contains("larger than the padded input"));
  CHECK_NOTHROW(conv2d(x, Tensor::zeros({6, 4, 7, 7}), {}, opts({1, 1}, {1, 1})));
  CHECK_THROWS_WITH(conv2d(x, w, {}, opts({0, 1}, {0, 0})),
                    Contains("conv2d: stride must be positive"));
  CHECK_THROWS_WITH(conv2d(x, w, {}, opts({1, 1}, {0, 0}, {1, -1})),
                    Contains("conv2d: dilation must be positive"));
  CHECK_THROWS_WITH(conv2d(x, w, {}, opts({1, 1}, {-1, 0})),
                    Contains("conv2d: padding must be non-negative"));
  CHECK_THROWS_WITH(conv2d(x, w, {}, opts({1, 1, 1}, {0, 0})),
                    Contains("conv2d: stride needs 1 or 2 values"));
  CHECK_THROWS_WITH(conv2d(x, w, Tensor::zeros({5})),
                    Contains("conv2d: bias must have shape [6]") && Contains("[5]"));
  CHECK_THROWS_WITH(conv2d(x.to(DType::f16), w), Contains("conv2d: input has dtype"));
  CHECK_THROWS_WITH(conv2d(x, w.to(DType::i64)), Contains("conv2d: weight has dtype"));
}

TEST_CASE("cuDNN is given canonical strides for activations with size-1 dimensions", "[conv]") {
  using detail::cudnn_activation_strides;
  using Strides = std::array<int64_t, 4>;
  // Global pooling's output [N,C,1,1] is channels-last, and reads as both layouts: beside an
  // NHWC filter (the SE block's 1x1 convolutions on the GPU) it is described as NHWC.
  Generator gen(31);
  const Tensor pooled = global_avg_pool2d(random_tensor({2, 8, 5, 5}, gen));
  CHECK(pooled.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(cudnn_activation_strides(pooled, true) == Strides{8, 1, 8, 8});
  CHECK(cudnn_activation_strides(pooled, false) == Strides{8, 1, 1, 1});
  // The same shape allocated contiguous (strides (8,1,1,1)) is described the same way.
  const Tensor plain = Tensor::empty({2, 8, 1, 1});
  CHECK(cudnn_activation_strides(plain, true) == Strides{8, 1, 8, 8});
  // Layouts without ambiguity keep theirs, whatever the filter.
  const Tensor cl =
      Tensor::empty({2, 3, 4, 5}, DType::f32, Device::cpu(), MemoryFormat::ChannelsLast);
  CHECK(cudnn_activation_strides(cl, false) == Strides{60, 1, 15, 3});
  const Tensor nchw = Tensor::empty({2, 3, 4, 5});
  CHECK(cudnn_activation_strides(nchw, true) == Strides{60, 20, 5, 1});
  // A strided view (every other column) is described with its own strides.
  const Tensor view = Tensor::empty({2, 3, 4, 10}).slice(3, 0, 10, 2);
  CHECK(cudnn_activation_strides(view, true) == Strides{120, 40, 10, 2});
  // A size-1 channel dimension: channels-last canonical beside an NHWC filter.
  const Tensor one_channel = Tensor::empty({2, 1, 4, 5});
  CHECK(cudnn_activation_strides(one_channel, true) == Strides{20, 1, 5, 1});
}

TEST_CASE("a stem convolution's weight gradient has the same bits on any thread count", "[conv]") {
  // 3 -> 16 channels: dpar's own kernel, which sums blocks of 8 output rows in a fixed order.
  Generator gen(25);
  const Tensor x = random_tensor({3, 3, 40, 36}, gen, -1, 1, MemoryFormat::ChannelsLast);
  const Tensor w0 = random_tensor({16, 3, 3, 3}, gen);
  const Tensor g = random_tensor({3, 16, 20, 18}, gen, -1, 1, MemoryFormat::ChannelsLast);
  const int threads_before = get_num_threads();
  auto weight_grad = [&](int threads) {
    set_num_threads(threads);
    Tensor w = w0.detach().set_requires_grad();
    conv2d(x, w, {}, opts({2, 2}, {1, 1})).backward(g);
    set_num_threads(threads_before);
    return w.grad().to_float_vector();
  };
  const std::vector<float> one = weight_grad(1);
  CHECK(weight_grad(2) == one);
  CHECK(weight_grad(3) == one);
}

TEST_CASE("a depthwise weight gradient over large maps matches a direct sum on any thread count",
          "[conv]") {
  // Maps too large for a channel block to stay in L2: the kernel sweeps several filter rows per
  // output row (depthwise_kernels.cpp). 24 channels: a 16-wide and an 8-wide block; 19 channels
  // of a 7x7 filter: two 8-wide blocks and three single channels. 3x3 filters go image by image
  // (three images: split unevenly over two threads), 20 channels: two vectors and a tail of 4.
  struct Case {
    Shape x;
    int64_t k, stride;
  };
  for (const Case& c : {Case{{2, 24, 40, 40}, 5, 1}, Case{{2, 19, 72, 72}, 7, 2},
                        Case{{3, 20, 57, 56}, 3, 2}, Case{{3, 72, 30, 30}, 3, 1}}) {
    Generator gen(26);
    const int64_t C = c.x[1], H = c.x[2], W = c.x[3], pad = c.k / 2;
    const Tensor x = random_tensor(c.x, gen, -1, 1, MemoryFormat::ChannelsLast);
    const Tensor w0 = random_tensor({C, 1, c.k, c.k}, gen);
    const Conv2dOptions o = opts({c.stride, c.stride}, {pad, pad}, {1, 1}, C);
    const Tensor y0 = conv2d(x, w0, {}, o);
    const Tensor g = random_tensor(y0.shape(), gen, -1, 1, MemoryFormat::ChannelsLast);
    const int64_t OH = y0.size(2), OW = y0.size(3);
    const std::vector<float> xv = x.to_float_vector(), gv = g.to_float_vector();
    std::vector<float> want(static_cast<size_t>(C * c.k * c.k));
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t kh = 0; kh < c.k; ++kh)
        for (int64_t kw = 0; kw < c.k; ++kw) {
          double s = 0;
          for (int64_t n = 0; n < c.x[0]; ++n)
            for (int64_t oh = 0; oh < OH; ++oh)
              for (int64_t ow = 0; ow < OW; ++ow) {
                const int64_t ih = oh * c.stride - pad + kh, iw = ow * c.stride - pad + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += static_cast<double>(gv[((n * C + ch) * OH + oh) * OW + ow]) *
                     xv[((n * C + ch) * H + ih) * W + iw];
              }
          want[static_cast<size_t>((ch * c.k + kh) * c.k + kw)] = static_cast<float>(s);
        }
    const int threads_before = get_num_threads();
    auto weight_grad = [&](int threads) {
      set_num_threads(threads);
      Tensor w = w0.detach().set_requires_grad();
      conv2d(x, w, {}, o).backward(g);
      set_num_threads(threads_before);
      return w.grad().to_float_vector();
    };
    const std::vector<float> one = weight_grad(1);
    // Sums of ~3000 products accumulated in f32 lanes, as oneDNN's are.
    CHECK(max_rel_error(one, want, 0.1) < 1e-3);
    CHECK(weight_grad(2) == one);
    CHECK(weight_grad(3) == one);
  }
}

TEST_CASE("a depthwise weight gradient's channels have the same bits in every vector block",
          "[conv]") {
  // 59 channels: with AVX-512 a block of 32 (two 16-lane vectors), one of 16, one of 8 (AVX2)
  // and three single channels; with AVX2 only, 5x5 filters take three blocks of 16 and 7x7 ones
  // seven of 8, then one of 8 and three singles. Every vector lane sums its channel's products in
  // the same order, so a channel's gradient computed in a narrower or wider vector block (the
  // channels alone) has the same bits. The single channels are summed apart (without fused
  // multiply-adds) and left out. In f32, and in bf16 under autocast where the CPU has it.
  struct Case {
    int64_t k, stride;
  };
  std::vector<DType> dtypes = {DType::f32};
  if (amp::cpu_bf16_support() != amp::CpuBf16::unsupported) dtypes.push_back(DType::bf16);
  for (const DType dtype : dtypes) {
    for (const Case& c : {Case{5, 1}, Case{7, 2}}) {
      INFO("filter " << c.k << " stride " << c.stride << ", " << dtype_name(dtype));
      Generator gen(27);
      const int64_t C = 59, pad = c.k / 2;
      const Tensor x = random_tensor({2, C, 12, 11}, gen, -1, 1, MemoryFormat::ChannelsLast);
      const Tensor w0 = random_tensor({C, 1, c.k, c.k}, gen);
      // Channels [c0, c1) of t, channels-last, in the activations' dtype.
      auto channels = [&](const Tensor& t, int64_t c0, int64_t c1) {
        const Tensor part = t.slice(1, c0, c1);
        Tensor out = Tensor::empty(part.shape(), dtype, Device::cpu(), MemoryFormat::ChannelsLast);
        out.copy_(part);
        return out;
      };
      auto weight_grad = [&](int64_t c0, int64_t c1) {
        const Conv2dOptions o = opts({c.stride, c.stride}, {pad, pad}, {1, 1}, c1 - c0);
        Tensor w = w0.slice(0, c0, c1).contiguous().detach().set_requires_grad();
        Tensor y;
        {
          amp::Autocast autocast(dtype);
          y = conv2d(channels(x, c0, c1), w, {}, o);
        }
        Generator g_gen(28);
        const Tensor g = random_tensor({2, C, y.size(2), y.size(3)}, g_gen, -1, 1);
        y.backward(channels(g, c0, c1));
        return w.grad().to_float_vector();
      };
      const std::vector<float> all = weight_grad(0, C);
      const auto taps = static_cast<int64_t>(c.k * c.k);
      // Channels of the 32-wide block alone (8 lanes) and as a block of 16, the 16-wide block's
      // in a block of 16, and the 8-wide block's in blocks of 16 and 32 with their neighbours.
      for (const auto& [c0, c1] :
           {std::pair<int64_t, int64_t>{0, 8}, {8, 24}, {32, 48}, {40, 56}, {24, 56}}) {
        INFO("channels " << c0 << " to " << c1);
        const std::vector<float> part = weight_grad(c0, c1);
        const std::vector<float> same(all.begin() + c0 * taps, all.begin() + c1 * taps);
        CHECK(part == same);
      }
    }
  }
}

TEST_CASE("a 3x3 stride-2 depthwise convolution has the same bits on any thread count", "[conv]") {
  // dpar's own forward and input gradient (depthwise_stride2_kernels.cpp): 40 channels, odd and
  // even sides, against direct convolution; every output and input-gradient element is one
  // thread's.
  Generator gen(27);
  const Tensor x0 = random_tensor({3, 40, 29, 30}, gen, -1, 1, MemoryFormat::ChannelsLast);
  const Tensor w = random_tensor({40, 1, 3, 3}, gen);
  const Tensor b = random_tensor({40}, gen);
  const Conv2dOptions o = opts({2, 2}, {1, 1}, {1, 1}, 40);
  const int threads_before = get_num_threads();
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor x = x0.detach().set_requires_grad();
    Tensor y = conv2d(x, w, b, o);
    y.backward(Tensor::ones(y.shape()));
    set_num_threads(threads_before);
    return std::pair{y.to_float_vector(), x.grad().to_float_vector()};
  };
  const auto [y1, dx1] = run(1);
  CHECK(max_rel_error(y1, reference_conv(x0, w, b, o, Shape{3, 40, 15, 15}), 0.1) < 1e-4);
  CHECK(run(2) == std::pair{y1, dx1});
  CHECK(run(3) == std::pair{y1, dx1});
}
