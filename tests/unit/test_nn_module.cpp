#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "dpar/dpar.h"
#include "dpar/nn/init.h"
#include "dpar/nn/layers.h"
#include "dpar/nn/module.h"

using namespace dpar;

namespace {

// A module with parameters, buffers and children registered in an interleaved order, to
// pin down torch's state-dict order (own params, own buffers, then children).
class Block : public nn::Module {
 public:
  Block() : Module("Block") {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(2, 4, 3, 1, 1, 1, 1, false));
    scale = register_parameter("scale", Tensor::ones({4}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
    steps = register_buffer("steps", Tensor::zeros({1}));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  Tensor scale, steps;
};

class Net : public nn::Module {
 public:
  Net() : Module("Net") {
    body = register_module(
        "body",
        std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
            std::make_shared<Block>(), std::make_shared<nn::ReLU>(), std::make_shared<Block>()}));
    head = register_module("head", std::make_shared<nn::Linear>(4, 3));
  }
  std::shared_ptr<nn::Sequential> body;
  std::shared_ptr<nn::Linear> head;
};

std::vector<std::string> names_of(const nn::NamedTensors& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.first);
  return out;
}

}  // namespace

TEST_CASE("state_dict follows torch's order and naming", "[nn]") {
  Net net;
  const std::vector<std::string> expected = {
      "body.0.scale",          "body.0.steps",
      "body.0.conv.weight",    "body.0.bn.weight",
      "body.0.bn.bias",        "body.0.bn.running_mean",
      "body.0.bn.running_var", "body.0.bn.num_batches_tracked",
      "body.2.scale",          "body.2.steps",
      "body.2.conv.weight",    "body.2.bn.weight",
      "body.2.bn.bias",        "body.2.bn.running_mean",
      "body.2.bn.running_var", "body.2.bn.num_batches_tracked",
      "head.weight",           "head.bias"};
  CHECK(names_of(net.state_dict()) == expected);

  const std::vector<std::string> params = {
      "body.0.scale", "body.0.conv.weight", "body.0.bn.weight", "body.0.bn.bias",
      "body.2.scale", "body.2.conv.weight", "body.2.bn.weight", "body.2.bn.bias",
      "head.weight",  "head.bias"};
  CHECK(names_of(net.named_parameters()) == params);
  CHECK(names_of(net.named_parameters(false)).empty());
  CHECK(names_of(net.head->named_parameters(false)) == std::vector<std::string>{"weight", "bias"});
  CHECK(names_of(net.named_buffers()) ==
        std::vector<std::string>{"body.0.steps", "body.0.bn.running_mean", "body.0.bn.running_var",
                                 "body.0.bn.num_batches_tracked", "body.2.steps",
                                 "body.2.bn.running_mean", "body.2.bn.running_var",
                                 "body.2.bn.num_batches_tracked"});
  auto children = net.named_children();
  REQUIRE(children.size() == 2);
  CHECK(children[0].first == "body");
  CHECK(children[1].first == "head");

  std::vector<std::string> modules;
  for (const auto& [name, m] : net.named_modules()) modules.push_back(name + ":" + m->type_name());
  CHECK(modules == std::vector<std::string>{":Net", "body:Sequential", "body.0:Block",
                                            "body.0.conv:Conv2d", "body.0.bn:BatchNorm2d",
                                            "body.1:ReLU", "body.2:Block", "body.2.conv:Conv2d",
                                            "body.2.bn:BatchNorm2d", "head:Linear"});

  // Shapes and dtypes as torch has them.
  CHECK(net.parameter("body.0.conv.weight").shape() == Shape{4, 2, 3, 3});
  CHECK(net.buffer("body.2.bn.num_batches_tracked").shape() == Shape{});
  CHECK(net.buffer("body.2.bn.num_batches_tracked").dtype() == DType::i64);
  CHECK(net.head->weight.shape() == Shape{3, 4});
  CHECK(net.num_parameters() == 2 * (4 + 72 + 4 + 4) + 12 + 3);
}

TEST_CASE("parameters are the handles the layers use", "[nn]") {
  Net net;
  auto params = net.parameters();
  REQUIRE(params.size() == 10);
  CHECK(params[8].is_same(net.head->weight));
  CHECK(params[9].is_same(net.head->bias));
  CHECK(net.parameter("head.weight").is_same(net.head->weight));
  auto block = net.body->at<Block>(0);
  CHECK(params[1].is_same(block->conv->weight));
  for (const Tensor& p : params) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  for (const Tensor& b : net.buffers()) CHECK_FALSE(b.requires_grad());
  // state_dict entries share memory with the module but carry no autograd state.
  auto sd = net.state_dict();
  CHECK(sd.back().second.storage() == net.head->bias.storage());
  CHECK_FALSE(sd.back().second.requires_grad());

  // set_grad on a handle from parameters() is seen through the layer's member.
  Tensor g = Tensor::full({3}, 2.0);
  params[9].set_grad(g);
  CHECK(net.head->bias.grad().is_same(g));
}

TEST_CASE("registration rejects bad names", "[nn]") {
  nn::Module m("Custom");
  m.register_parameter("w", Tensor::zeros({2}));
  CHECK_THROWS_WITH(m.register_parameter("w", Tensor::zeros({2})),
                    Catch::Contains("'w' is already registered"));
  CHECK_THROWS_WITH(m.register_buffer("w", Tensor::zeros({2})),
                    Catch::Contains("already registered"));
  CHECK_THROWS_WITH(m.register_module("w", std::make_shared<nn::ReLU>()),
                    Catch::Contains("already registered"));
  CHECK_THROWS_WITH(m.register_parameter("a.b", Tensor::zeros({2})),
                    Catch::Contains("must not contain '.'"));
  CHECK_THROWS_WITH(m.register_buffer("", Tensor::zeros({2})), Catch::Contains("empty"));
  CHECK_THROWS_WITH(m.register_parameter("i", Tensor::zeros({2}, DType::i64)),
                    Catch::Contains("cannot require gradients"));
  CHECK_THROWS_WITH(m.register_module("n", std::shared_ptr<nn::ReLU>()),
                    Catch::Contains("is null"));
  CHECK_THROWS_WITH(m.forward(Tensor::zeros({1})), Catch::Contains("Custom::forward"));
  CHECK_THROWS_WITH(m.parameter("nope"), Catch::Contains("no parameter 'nope'"));
  CHECK_THROWS_WITH(m.child("x.y"), Catch::Contains("no submodule 'x.y'"));
  // A buffer may be of any dtype and never requires grad.
  CHECK_FALSE(m.register_buffer("count", Tensor::zeros({}, DType::i64)).requires_grad());
  CHECK_FALSE(m.register_parameter("frozen", Tensor::zeros({2}), false).requires_grad());
}

TEST_CASE("train and eval are recursive", "[nn]") {
  Net net;
  CHECK(net.is_training());
  net.eval();
  for (const auto& [name, m] : net.named_modules()) CHECK_FALSE(m->is_training());
  net.body->train();
  CHECK_FALSE(net.is_training());
  CHECK(net.body->at<Block>(2)->bn->is_training());
  CHECK_FALSE(net.head->is_training());
  net.train();
  for (const auto& [name, m] : net.named_modules()) CHECK(m->is_training());
}

TEST_CASE("zero_grad zeroes in place or drops gradients", "[nn]") {
  Net net;
  Tensor g = Tensor::full({3, 4}, 1.5);
  net.head->weight.set_grad(g);
  net.zero_grad();
  REQUIRE(net.head->weight.grad().defined());
  CHECK(net.head->weight.grad().is_same(g));  // same memory (DataParallel bucket views)
  CHECK(g.to_float_vector() == std::vector<float>(12, 0.f));
  CHECK_FALSE(net.head->bias.grad().defined());
  net.zero_grad(/*set_to_none=*/true);
  CHECK_FALSE(net.head->weight.grad().defined());
}

TEST_CASE("load_state_dict copies in place and reports problems by name", "[nn]") {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  REQUIRE(a.head->weight.to_float_vector() != b.head->weight.to_float_vector());

  SECTION("round trip") {
    Tensor before = b.head->weight;
    auto report = b.load_state_dict(a.state_dict());
    CHECK(report.ok());
    CHECK(report.str().empty());
    CHECK(b.head->weight.is_same(before));  // in place
    CHECK(b.head->weight.requires_grad());
    const auto sa = a.state_dict(), sb = b.state_dict();
    for (size_t i = 0; i < sa.size(); ++i) {
      INFO(sa[i].first);
      CHECK(sa[i].second.dtype() == sb[i].second.dtype());
      CHECK(sa[i].second.to_float_vector() == sb[i].second.to_float_vector());
    }
  }

  SECTION("strict load lists every problem and loads nothing") {
    auto sd = a.state_dict();
    const auto head_before = b.head->weight.to_float_vector();
    sd.erase(sd.begin() + 2);                             // body.0.conv.weight missing
    sd.emplace_back("extra.weight", Tensor::zeros({1}));  // unexpected
    sd[sd.size() - 3].second = Tensor::zeros({4, 3});     // head.weight mis-shaped
    try {
      b.load_state_dict(sd);
      FAIL("expected an error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains("3 problem(s)"));
      CHECK_THAT(msg, Catch::Contains("missing: body.0.conv.weight"));
      CHECK_THAT(msg, Catch::Contains("unexpected: extra.weight"));
      CHECK_THAT(
          msg, Catch::Contains("shape mismatch: head.weight: module has [3,4], source has [4,3]"));
    }
    CHECK(b.head->weight.to_float_vector() == head_before);

    auto report = b.load_state_dict(sd, /*strict=*/false);
    CHECK(report.missing == std::vector<std::string>{"body.0.conv.weight"});
    CHECK(report.unexpected == std::vector<std::string>{"extra.weight"});
    REQUIRE(report.mismatched.size() == 1);
    CHECK(report.mismatched[0].name == "head.weight");
    CHECK(report.mismatched[0].expected == Shape{3, 4});
    CHECK(report.mismatched[0].got == Shape{4, 3});
    CHECK(b.head->weight.to_float_vector() == head_before);  // mis-shaped: not copied
    CHECK(b.head->bias.to_float_vector() == a.head->bias.to_float_vector());
    CHECK(b.compare_state_dict(sd).str() == report.str());
  }

  SECTION("dtypes are converted, duplicates rejected") {
    nn::NamedTensors sd = a.state_dict();
    for (auto& [name, t] : sd) {
      if (t.dtype() == DType::f32) t = t.to(DType::f16);
    }
    b.load_state_dict(sd);
    CHECK(b.head->weight.dtype() == DType::f32);
    CHECK(b.head->weight.to_float_vector() ==
          a.head->weight.to(DType::f16).to(DType::f32).to_float_vector());
    sd.push_back(sd.front());
    CHECK_THROWS_WITH(b.load_state_dict(sd), Catch::Contains("'body.0.scale' appears twice"));
  }
}

TEST_CASE("layers register torch's parameters with torch's default init", "[nn]") {
  manual_seed(0);
  nn::Conv2d conv(8, 16, 3, 2, 1, 1, 4, true);
  CHECK(conv.weight.shape() == Shape{16, 2, 3, 3});
  CHECK(conv.bias.shape() == Shape{16});
  const double bound = 1.0 / std::sqrt(2.0 * 9.0);
  for (float v : conv.weight.to_float_vector()) CHECK(std::abs(v) <= bound);
  for (float v : conv.bias.to_float_vector()) CHECK(std::abs(v) <= bound);
  CHECK(conv.repr() == "Conv2d(8, 16, kernel_size=3, stride=2, padding=1, groups=4)");
  nn::Conv2d nobias(3, 4, 1, 1, 0, 1, 1, false);
  CHECK_FALSE(nobias.bias.defined());
  CHECK(names_of(nobias.named_parameters()) == std::vector<std::string>{"weight"});
  CHECK_THROWS_WITH(nn::Conv2d(6, 4, 3, 1, 0, 1, 4), Catch::Contains("groups 4 must divide"));

  nn::BatchNorm2d bn(5, 1e-3, 0.01);
  CHECK(names_of(bn.state_dict()) == std::vector<std::string>{"weight", "bias", "running_mean",
                                                              "running_var",
                                                              "num_batches_tracked"});
  CHECK(bn.weight.to_float_vector() == std::vector<float>(5, 1.f));
  CHECK(bn.bias.to_float_vector() == std::vector<float>(5, 0.f));
  CHECK(bn.running_var.to_float_vector() == std::vector<float>(5, 1.f));
  CHECK(bn.num_batches_tracked.item() == 0);
  CHECK(bn.repr() == "BatchNorm2d(5, eps=0.001, momentum=0.01, affine=True)");

  nn::Linear fc(10, 3);
  CHECK(fc.weight.shape() == Shape{3, 10});
  for (float v : fc.weight.to_float_vector()) CHECK(std::abs(v) <= 1.0 / std::sqrt(10.0));
  CHECK(fc.repr() == "Linear(in_features=10, out_features=3, bias=True)");

  // Same seed, same values; the named options build the same layer as the positional form.
  manual_seed(0);
  nn::Conv2d again(8, 16, 3, 2, 1, 1, 4, true);
  CHECK(again.weight.to_float_vector() == conv.weight.to_float_vector());
  manual_seed(0);
  nn::Conv2d named(nn::Conv2dOptions(8, 16, 3).stride(2).padding(1).groups(4));
  CHECK(named.weight.to_float_vector() == conv.weight.to_float_vector());
  CHECK(named.repr() == conv.repr());
  CHECK_FALSE(nn::Conv2d(nn::Conv2dOptions(3, 4, 1).bias(false)).bias.defined());
  CHECK(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).dilation(2)).dilation == 2);
}

TEST_CASE("init functions match torch.nn.init's statistics", "[nn][init]") {
  using namespace nn::init;
  CHECK(calculate_gain(Nonlinearity::ReLU) == Approx(std::sqrt(2.0)));
  CHECK(calculate_gain(Nonlinearity::LeakyReLU, 0.0) == Approx(std::sqrt(2.0)));
  CHECK(calculate_gain(Nonlinearity::Tanh) == Approx(5.0 / 3.0));
  CHECK(calculate_fan_in_and_fan_out(Tensor::empty({64, 16, 3, 3})) ==
        std::pair<int64_t, int64_t>{144, 576});
  CHECK_THROWS_WITH(calculate_fan_in_and_fan_out(Tensor::empty({4})),
                    Catch::Contains("at least 2 dimensions"));

  auto stats = [](const Tensor& t) {
    const auto v = t.to_float_vector();
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    const double mean = s / static_cast<double>(v.size());
    for (float x : v) s2 += (x - mean) * (x - mean);
    return std::pair<double, double>{mean, std::sqrt(s2 / static_cast<double>(v.size() - 1))};
  };

  Generator gen(42);
  Tensor w = Tensor::empty({256, 64, 3, 3}, DType::f32, Device::cpu(), MemoryFormat::ChannelsLast);
  kaiming_normal_(w, 0.0, FanMode::FanOut, Nonlinearity::ReLU, gen);
  auto [m1, s1] = stats(w);
  CHECK(std::abs(m1) < 0.002);
  CHECK(s1 == Approx(std::sqrt(2.0 / (256 * 9))).epsilon(0.01));
  CHECK(w.is_contiguous(MemoryFormat::ChannelsLast));  // layout kept

  Tensor n = Tensor::empty({100000});
  normal_(n, 1.0, 0.01, gen);
  auto [m2, s2] = stats(n);
  CHECK(m2 == Approx(1.0).epsilon(0.001));
  CHECK(s2 == Approx(0.01).epsilon(0.01));

  Tensor u = Tensor::empty({100000});
  uniform_(u, -2.0, 2.0, gen);
  auto [m3, s3] = stats(u);
  CHECK(std::abs(m3) < 0.02);
  CHECK(s3 == Approx(4.0 / std::sqrt(12.0)).epsilon(0.01));
  for (float v : u.to_float_vector()) CHECK((v >= -2.f && v < 2.f));

  Tensor k = Tensor::empty({128, 512});
  kaiming_uniform_(k, std::sqrt(5.0), FanMode::FanIn, Nonlinearity::LeakyReLU, gen);
  for (float v : k.to_float_vector()) CHECK(std::abs(v) <= 1.0 / std::sqrt(512.0));

  // Deterministic: the same generator state gives the same values, in logical order.
  Generator g1(7), g2(7);
  Tensor a = Tensor::empty({4, 3, 2, 2});
  Tensor b = Tensor::empty({4, 3, 2, 2}, DType::f32, Device::cpu(), MemoryFormat::ChannelsLast);
  normal_(a, 0, 1, g1);
  normal_(b, 0, 1, g2);
  CHECK(a.to_float_vector() == b.to_float_vector());

  CHECK(ones_(Tensor::empty({3})).to_float_vector() == std::vector<float>{1, 1, 1});
  CHECK(zeros_(Tensor::empty({2}, DType::f16)).to_float_vector() == std::vector<float>{0, 0});
  CHECK(constant_(Tensor::empty({2}), 0.5).to_float_vector() == std::vector<float>{0.5, 0.5});
  CHECK_THROWS_WITH(normal_(Tensor::empty({2}, DType::i64)), Catch::Contains("floating"));
}

TEST_CASE("sequential containers and shape-only layers", "[nn]") {
  nn::Sequential seq{std::make_shared<nn::Identity>(), std::make_shared<nn::Flatten>()};
  seq.push_back(std::make_shared<nn::Identity>());
  CHECK(seq.size() == 3);
  CHECK(names_of(seq.state_dict()).empty());
  std::vector<std::string> children;
  for (const auto& [name, m] : seq.named_children()) children.push_back(name);
  CHECK(children == std::vector<std::string>{"0", "1", "2"});
  CHECK(seq.at<nn::Flatten>(1)->start_dim == 1);
  CHECK_THROWS_WITH(seq.at<nn::Linear>(1), Catch::Contains("child 1 is a Flatten"));
  CHECK_THROWS_WITH(seq[3], Catch::Contains("index 3 out of range"));
  Tensor x = Tensor::zeros({2, 3, 4, 5});
  CHECK(seq.forward(x).shape() == Shape{2, 60});
  CHECK(seq(x).shape() == Shape{2, 60});
  CHECK(seq.repr() ==
        "Sequential(\n  (0): Identity()\n  (1): Flatten(start_dim=1, end_dim=-1)\n  (2): "
        "Identity()\n)");
  CHECK_THROWS_WITH(nn::AdaptiveAvgPool2d(0), Catch::Contains("output size must be positive"));
  CHECK_THROWS_WITH(nn::Dropout(1.5), Catch::Contains("[0, 1]"));
  int visited = 0;
  seq.apply([&](nn::Module&) { ++visited; });
  CHECK(visited == 4);
}

TEST_CASE("layer forwards use the registered parameters", "[nn][forward]") {
  manual_seed(5);
  Generator gen(9);
  Tensor x = Tensor::empty({2, 4, 6, 6});
  nn::init::normal_(x, 0.0, 1.0, gen);

  nn::Conv2d conv(4, 6, 3, 2, 1, 1, 2, true);
  Conv2dOptions options;
  options.stride = {2, 2};
  options.padding = {1, 1};
  options.groups = 2;
  Tensor y = conv(x);
  CHECK(y.shape() == Shape{2, 6, 3, 3});
  CHECK(y.to_float_vector() == conv2d(x, conv.weight, conv.bias, options).to_float_vector());

  // BatchNorm2d: batch statistics, counter and running statistics in training mode only.
  nn::BatchNorm2d bn(6, 1e-5, 0.1);
  Tensor z = bn(y);
  CHECK(z.shape() == y.shape());
  CHECK(bn.num_batches_tracked.item() == 1);
  bn(y);
  CHECK(bn.num_batches_tracked.item() == 2);
  const auto running_mean = bn.running_mean.to_float_vector();
  CHECK(running_mean != std::vector<float>(6, 0.f));
  const auto zv = z.to_float_vector();
  double channel0 = 0;
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t i = 0; i < 9; ++i) channel0 += zv[static_cast<size_t>(n * 54 + i)];
  }
  CHECK(channel0 / 18.0 == Approx(0.0).margin(1e-5));  // normalised with batch statistics
  bn.eval();
  bn(y);
  CHECK(bn.num_batches_tracked.item() == 2);
  CHECK(bn.running_mean.to_float_vector() == running_mean);

  // Linear treats leading dimensions as batch dimensions.
  nn::Linear fc(6, 3);
  Tensor flat = nn::Flatten(2)(y).transpose(1, 2);  // [2, 9, 6]
  Tensor out = fc(flat);
  CHECK(out.shape() == Shape{2, 9, 3});
  // Different row counts may block the GEMM differently: equal up to rounding.
  const auto batched = out.select(0, 1).to_float_vector();
  const auto single = linear(flat.select(0, 1).contiguous(), fc.weight, fc.bias).to_float_vector();
  REQUIRE(batched.size() == single.size());
  for (size_t i = 0; i < single.size(); ++i) CHECK(batched[i] == Approx(single[i]).margin(1e-6));

  nn::Dropout drop(0.5);
  Tensor ones = Tensor::ones({1000});
  CHECK(drop(ones).to_float_vector() != ones.to_float_vector());
  drop.eval();
  CHECK(drop(ones).to_float_vector() == ones.to_float_vector());

  nn::AdaptiveAvgPool2d pool;
  CHECK(pool(y).shape() == Shape{2, 6, 1, 1});
}

TEST_CASE("backward reaches every parameter through the module's handles", "[nn][forward]") {
  manual_seed(6);
  nn::Sequential net{std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1),
                     std::make_shared<nn::BatchNorm2d>(8),
                     std::make_shared<nn::Hardswish>(),
                     std::make_shared<nn::AdaptiveAvgPool2d>(),
                     std::make_shared<nn::Flatten>(),
                     std::make_shared<nn::Linear>(8, 4),
                     std::make_shared<nn::Hardsigmoid>()};
  Generator gen(2);
  Tensor x = nn::init::normal_(Tensor::empty({2, 3, 5, 5}), 0.0, 1.0, gen);
  sum(net(x)).backward();
  for (const auto& [name, p] : net.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().shape() == p.shape());
  }
  net.zero_grad();
  for (const Tensor& p : net.parameters()) {
    for (float v : p.grad().to_float_vector()) CHECK(v == 0.f);
  }
}

// Found by ThreadSanitizer: ranks running as threads built their models at once, and every
// layer's constructor draws its init from the shared default generator, racing on its engine.
// Whole fills now take the generator's lock in turn, so the generator ends exactly as many
// draws further as all threads made together, whatever the interleaving.
TEST_CASE("threads initialising layers from the default generator take turns", "[nn][init]") {
  constexpr int kThreads = 4, kLayers = 25;
  manual_seed(123);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kLayers; ++i) nn::Linear layer(40, 30);  // 1200 + 30 draws each
    });
  }
  for (auto& t : threads) t.join();
  Generator expected(123);
  for (int i = 0; i < kThreads * kLayers * (40 * 30 + 30); ++i) (void)expected.uniform();
  REQUIRE(default_generator().state() == expected.state());
}
