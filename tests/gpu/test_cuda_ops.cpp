// Every op MobileNetV3 and the optimizers use, forward and backward, on CUDA against the CPU
// backend: the same inputs go through both, and the outputs and the gradients of a random
// projection of the output must agree to 1e-4 relative (f32).
#include <functional>

#include "gpu/gpu_helpers.h"
#include "tensor/cuda/conv_graph.h"
#include "unit/helpers.h"

using namespace dpar;

namespace {

constexpr double kTol = 1e-4;

Tensor channels_last(const Tensor& t) { return t.contiguous(MemoryFormat::ChannelsLast); }

}  // namespace

TEST_CASE("copies between dtypes and layouts and host transfers match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({2, 3, 5, 7}, 1, -4, 4);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i64, DType::u8}) {
    INFO("dtype " << dtype_name(t));
    const Tensor src = t == DType::u8 ? mul(add(x, 4.0), 10.0) : x;
    CHECK(relative_error(src.to(t), src.to(kGpu).to(t)) == 0.0);
    CHECK(relative_error(channels_last(src.to(t)), channels_last(src.to(kGpu).to(t))) == 0.0);
  }
  CHECK(relative_error(x.transpose(1, 3).contiguous(), x.to(kGpu).transpose(1, 3).contiguous()) ==
        0.0);
  Tensor filled = Tensor::full({3, 4}, 2.5, DType::f32, kGpu);
  CHECK(filled.to_float_vector() == std::vector<float>(12, 2.5f));
  Tensor slice = Tensor::zeros({4, 6}, DType::f32, kGpu).slice(1, 1, 5, 2);
  slice.fill_(7.0);
  CHECK(sum(slice.contiguous()).item() == 56.0);
}

TEST_CASE("elementwise, unary and reduction ops match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor a = random_tensor({4, 3, 5}, 2), b = random_tensor({4, 3, 5}, 3, 0.5f, 2.f);
  const Tensor row = random_tensor({1, 3, 1}, 4, 0.5f, 2.f);
  compare_op("add", [](auto& t) { return add(t[0], t[1]); }, {a, b});
  compare_op("sub broadcast", [](auto& t) { return sub(t[0], t[1]); }, {a, row});
  compare_op("mul broadcast", [](auto& t) { return mul(t[0], t[1]); }, {a, row});
  compare_op("div", [](auto& t) { return div(t[0], t[1]); }, {a, b});
  compare_op("scalar affine", [](auto& t) { return add(mul(t[0], 3.0), -0.5); }, {a});
  compare_op("exp", [](auto& t) { return exp(t[0]); }, {a});
  compare_op("log", [](auto& t) { return log(t[0]); }, {b});
  compare_op("sqrt", [](auto& t) { return sqrt(t[0]); }, {b});
  compare_op("square", [](auto& t) { return square(t[0]); }, {a});
  const Tensor wide = random_tensor({4, 3, 5}, 5, -5, 5);
  compare_op("relu", [](auto& t) { return relu(t[0]); }, {wide});
  compare_op("hardswish", [](auto& t) { return hardswish(t[0]); }, {wide});
  compare_op("hardsigmoid", [](auto& t) { return hardsigmoid(t[0]); }, {wide});
  compare_op("sigmoid", [](auto& t) { return sigmoid(t[0]); }, {wide});
  compare_op("relu on a transposed view", [](auto& t) { return relu(t[0].transpose(0, 2)); },
             {wide});
  compare_op("sum all", [](auto& t) { return sum(t[0]); }, {a});
  compare_op("sum dims", [](auto& t) { return sum(t[0], {0, 2}, true); }, {a});
  compare_op("mean dims", [](auto& t) { return mean(t[0], {1}); }, {a});
  const Tensor big = random_tensor({256, 1000}, 6);
  compare_op("sum over a long dim", [](auto& t) { return sum(t[0], {0}); }, {big});
}

// One value per (sample, channel) against a full 4-D tensor, in both layouts and operand
// orders: the squeeze-and-excitation gate, which has its own CUDA kernel.
TEST_CASE("per-channel broadcasts over 4-D tensors match the CPU in both layouts") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({3, 5, 4, 6}, 20),
               gate = random_tensor({3, 5, 1, 1}, 21, 0.5f, 2.f),
               per_channel = random_tensor({1, 5, 1, 1}, 22, 0.5f, 2.f),
               per_sample = random_tensor({3, 1, 1, 1}, 23, 0.5f, 2.f);
  for (const bool nhwc : {false, true}) {
    INFO("channels-last " << nhwc);
    const Tensor full = nhwc ? channels_last(x) : x;
    for (const Tensor& g : {gate, per_channel, per_sample}) {
      compare_op("mul gate", [](auto& t) { return mul(t[0], t[1]); }, {full, g});
      compare_op("gate mul", [](auto& t) { return mul(t[1], t[0]); }, {full, g});
      compare_op("gate sub", [](auto& t) { return sub(t[1], t[0]); }, {full, g});
      compare_op("div gate", [](auto& t) { return div(t[0], t[1]); }, {full, g});
    }
  }
}

TEST_CASE("dropout on the GPU keeps the CPU's mask for the same seed") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({8, 16}, 7);
  Generator g1(42), g2(42);
  Tensor cpu = dropout(x, 0.3, true, g1), gpu = dropout(x.to(kGpu), 0.3, true, g2);
  CHECK(relative_error(cpu, gpu) <= kTol);
  // Masks go to the GPU without waiting (pinned memory): back-to-back draws must still each
  // arrive intact while earlier ones are in flight.
  std::vector<Tensor> on_gpu, on_cpu;
  for (int i = 0; i < 8; ++i) {
    on_cpu.push_back(dropout(x, 0.5, true, g1));
    on_gpu.push_back(dropout(x.to(kGpu), 0.5, true, g2));
  }
  for (int i = 0; i < 8; ++i) CHECK(relative_error(on_cpu[i], on_gpu[i]) <= kTol);
}

TEST_CASE("linear and matmul match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({32, 64}, 8), w = random_tensor({10, 64}, 9),
               bias = random_tensor({10}, 10);
  compare_op("linear", [](auto& t) { return linear(t[0], t[1], t[2]); }, {x, w, bias});
  compare_op("linear without bias", [](auto& t) { return linear(t[0], t[1]); }, {x, w});
  compare_op("matmul of a transposed view",
             [](auto& t) { return matmul(t[0].transpose(0, 1), t[1]); },
             {random_tensor({64, 32}, 11), random_tensor({64, 16}, 12)});
}

TEST_CASE("convolutions match the CPU: dense, strided, dilated, grouped, depthwise") {
  DPAR_REQUIRE_GPU();
  struct Case {
    const char* name;
    Shape x, w;
    Conv2dOptions opt;
    bool bias;
  };
  const std::vector<Case> cases = {
      {"3x3 pad 1", {2, 8, 12, 12}, {16, 8, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
      {"1x1", {2, 16, 7, 7}, {24, 16, 1, 1}, {}, false},
      {"stride 2", {2, 8, 13, 13}, {8, 8, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}, false},
      {"dilation 2", {1, 4, 11, 11}, {6, 4, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 1}, true},
      {"groups 2", {2, 8, 9, 9}, {8, 4, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}, false},
      {"depthwise 5x5 stride 2",
       {2, 16, 14, 14},
       {16, 1, 5, 5},
       {{2, 2}, {2, 2}, {1, 1}, 16},
       false},
      {"depthwise 3x3", {2, 24, 10, 10}, {24, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 24}, false},
      {"stem 3 -> 16 stride 2", {2, 3, 16, 16}, {16, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}, false},
      // Over 2^20 activation elements: cuDNN's runtime-compiled engines are candidates too.
      {"large depthwise 3x3 stride 2",
       {8, 64, 56, 56},
       {64, 1, 3, 3},
       {{2, 2}, {1, 1}, {1, 1}, 64},
       false},
  };
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.x, 13), w = random_tensor(c.w, 14, -0.3f, 0.3f);
    const Conv2dOptions opt = c.opt;
    if (c.bias) {
      compare_op(c.name, [opt](auto& t) { return conv2d(t[0], t[1], t[2], opt); },
                 {x, w, random_tensor({c.w[0]}, 15)});
    } else {
      compare_op(c.name, [opt](auto& t) { return conv2d(t[0], t[1], {}, opt); }, {x, w});
      compare_op(c.name, [opt](auto& t) { return conv2d(channels_last(t[0]), t[1], {}, opt); },
                 {x, w});
    }
  }
}

// Every convolution above that is not a GEMM ran on a graph-API engine of cuDNN: the legacy
// API is only the fallback (a problem no engine takes), not where MobileNetV3's depthwise and
// stem convolutions end up. Skipped under DPAR_CUDNN_API=legacy.
TEST_CASE("the graph API runs every non-pointwise convolution") {
  DPAR_REQUIRE_GPU();
  if (!cuda::conv_graph_enabled()) return;
  const Tensor x = random_tensor({2, 16, 14, 14}, 30), w = random_tensor({16, 1, 5, 5}, 31);
  const Conv2dOptions opt{{2, 2}, {2, 2}, {1, 1}, 16};
  compare_op("depthwise 5x5 stride 2", [opt](auto& t) { return conv2d(t[0], t[1], {}, opt); },
             {x, w});
  const cuda::ConvGraphCounts counts = cuda::conv_graph_counts();
  CHECK(counts.on_graph >= 3);  // this problem's three directions at least
  CHECK(counts.on_legacy == 0);
}

// MobileNetV3's squeeze-and-excitation block: 1x1 convolutions with bias on the [N,C,1,1]
// output of global pooling, whose size-1 dimensions leave its layout ambiguous to cuDNN; and
// the same convolution on a [N,C,1,1] tensor allocated contiguous.
TEST_CASE("convolutions on [N,C,1,1] (the SE block) match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({4, 16, 7, 7}, 31);
  const Tensor w1 = random_tensor({8, 16, 1, 1}, 32, -0.3f, 0.3f), b1 = random_tensor({8}, 33);
  const Tensor w2 = random_tensor({16, 8, 1, 1}, 34, -0.3f, 0.3f), b2 = random_tensor({16}, 35);
  compare_op("SE block",
             [](auto& t) {
               const Tensor pooled = global_avg_pool2d(channels_last(t[0]));
               const Tensor squeeze = relu(conv2d(pooled, t[1], t[2]));
               return mul(t[0], hardsigmoid(conv2d(squeeze, t[3], t[4])));
             },
             {x, w1, b1, w2, b2});
  compare_op("1x1 on a contiguous [N,C,1,1]",
             [](auto& t) { return conv2d(t[0].contiguous(), t[1], t[2]); },
             {random_tensor({4, 16, 1, 1}, 36), w1, b1});
}

TEST_CASE("batch norm (training and eval, both layouts, fused activations) matches the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({4, 6, 5, 5}, 16, -2, 3);
  const Tensor weight = random_tensor({6}, 17, 0.5f, 1.5f), bias = random_tensor({6}, 18);
  for (bool training : {true, false}) {
    for (Activation act : {Activation::none, Activation::relu, Activation::hardswish}) {
      for (bool nhwc : {false, true}) {
        INFO("training " << training << " act " << static_cast<int>(act) << " nhwc " << nhwc);
        Tensor rm_cpu = random_tensor({6}, 19), rv_cpu = random_tensor({6}, 20, 0.5f, 2.f);
        Tensor rm_gpu = rm_cpu.to(kGpu), rv_gpu = rv_cpu.to(kGpu);
        compare_op("batch_norm_act",
                   [&](auto& t) {
                     const bool gpu = t[0].device().is_cuda();
                     return batch_norm_act(nhwc ? channels_last(t[0]) : t[0], t[1], t[2],
                                           gpu ? rm_gpu : rm_cpu, gpu ? rv_gpu : rv_cpu, training,
                                           0.1, 1e-5, act);
                   },
                   {x, weight, bias});
        CHECK(relative_error(rm_cpu, rm_gpu) <= kTol);
        CHECK(relative_error(rv_cpu, rv_gpu) <= kTol);
      }
    }
  }
}

// The reductions' larger-problem paths: BatchNorm statistics over more chunks than a warp has
// lanes and over many channel tiles, the channels-last squeeze (global pooling) and the SE
// gate's gradient (a sum over H and W per sample and channel), tails of partial channel tiles
// and of pixel lanes, reduced dims that do not merge into one stride, and a bias gradient over
// a batch of [N,C,1,1].
TEST_CASE("reductions at MobileNetV3-small's sizes match the CPU") {
  DPAR_REQUIRE_GPU();
  for (const Shape& shape : {Shape{4, 16, 56, 56}, Shape{8, 576, 7, 7}, Shape{3, 40, 9, 11}}) {
    INFO("shape " << shape_str(shape));
    const int64_t C = shape[1];
    const Tensor x = random_tensor(shape, 40, -2, 3);
    const Tensor weight = random_tensor({C}, 41, 0.5f, 1.5f), bias = random_tensor({C}, 42);
    Tensor rm_cpu = random_tensor({C}, 43), rv_cpu = random_tensor({C}, 44, 0.5f, 2.f);
    Tensor rm_gpu = rm_cpu.to(kGpu), rv_gpu = rv_cpu.to(kGpu);
    compare_op("batch_norm_act training, channels-last",
               [&](auto& t) {
                 const bool gpu = t[0].device().is_cuda();
                 return batch_norm_act(channels_last(t[0]), t[1], t[2], gpu ? rm_gpu : rm_cpu,
                                       gpu ? rv_gpu : rv_cpu, true, 0.1, 1e-5, Activation::none);
               },
               {x, weight, bias});
    CHECK(relative_error(rm_cpu, rm_gpu) <= kTol);
    CHECK(relative_error(rv_cpu, rv_gpu) <= kTol);
    compare_op("global_avg_pool2d nhwc",
               [](auto& t) { return global_avg_pool2d(channels_last(t[0])); }, {x});
    const Tensor gate = random_tensor({shape[0], C, 1, 1}, 45, 0.5f, 2.f);
    compare_op("gate mul nhwc", [](auto& t) { return mul(channels_last(t[0]), t[1]); }, {x, gate});
    compare_op("sum over H, W nhwc",
               [](auto& t) {
                 return sum(channels_last(t[0]), {2, 3}, true);
               },
               {x});
  }
  compare_op("sum over dims 0 and 3",
             [](auto& t) {
               return sum(t[0], {0, 3}, true);
             },
             {random_tensor({6, 40, 5, 7}, 46)});
  compare_op("1x1 convolution with bias on [128,16,1,1]",
             [](auto& t) { return conv2d(t[0], t[1], t[2]); },
             {random_tensor({128, 16, 1, 1}, 47), random_tensor({8, 16, 1, 1}, 48, -0.3f, 0.3f),
              random_tensor({8}, 49)});
}

TEST_CASE("pooling, softmax, cross-entropy, argmax and top-k match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({4, 8, 7, 7}, 21);
  compare_op("global_avg_pool2d", [](auto& t) { return global_avg_pool2d(t[0]); }, {x});
  compare_op("global_avg_pool2d nhwc",
             [](auto& t) { return global_avg_pool2d(channels_last(t[0])); }, {x});
  const Tensor logits = random_tensor({16, 10}, 22, -4, 4);
  compare_op("softmax", [](auto& t) { return softmax(t[0], 1); }, {logits});
  compare_op("log_softmax", [](auto& t) { return log_softmax(t[0], 1); }, {logits});
  compare_op("softmax dim 0", [](auto& t) { return softmax(t[0], 0); }, {logits});
  std::vector<int64_t> labels(16);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7) % 10);
  const Tensor target = Tensor::from_vector(labels, {16});
  for (double smoothing : {0.0, 0.1}) {
    compare_op("cross_entropy", [&](auto& t) { return cross_entropy(t[0], t[1], smoothing); },
               {logits, target});
  }
  CHECK(argmax(logits, 1).to_int_vector() == argmax(logits.to(kGpu), 1).to_int_vector());
  CHECK(topk_indices(logits, 5).to_int_vector() ==
        topk_indices(logits.to(kGpu), 5).to_int_vector());
}

TEST_CASE("a label outside the classes is an error at the next synchronisation") {
  DPAR_REQUIRE_GPU();
  const Tensor logits = random_tensor({4, 10}, 23).to(kGpu);
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{1, 2, 12, 3}, {4}).to(kGpu);
  const std::string msg = error_of([&] { cross_entropy(logits, target).item(); });
  CHECK_THAT(msg, Catch::Contains("12"));
  CHECK_THAT(msg, Catch::Contains("[0, 10)"));
  // The device stays usable.
  CHECK(sum(Tensor::ones({3}, DType::f32, kGpu)).item() == 3.0);
}

TEST_CASE("optimizer steps on the GPU match the CPU") {
  DPAR_REQUIRE_GPU();
  auto run = [](Device device, const std::string& which) {
    Tensor p = random_tensor({64, 33}, 24).to(device).clone();
    p.set_requires_grad(true);
    std::unique_ptr<optim::Optimizer> opt;
    if (which == "sgd") {
      opt = std::make_unique<optim::SGD>(
          std::vector<Tensor>{p},
          optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
    } else if (which == "rmsprop") {
      opt = std::make_unique<optim::RMSprop>(
          std::vector<Tensor>{p},
          optim::RMSpropOptions{.lr = 0.01, .momentum = 0.9, .centered = true});
    } else {
      opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, optim::AdamWOptions{.lr = 0.01});
    }
    for (uint64_t step = 0; step < 3; ++step) {
      p.set_grad(random_tensor({64, 33}, 100 + step).to(device));
      opt->step();
    }
    return p.detach();
  };
  for (const char* which : {"sgd", "rmsprop", "adamw"}) {
    INFO(which);
    CHECK(relative_error(run(Device::cpu(), which), run(kGpu, which)) <= kTol);
  }
}
