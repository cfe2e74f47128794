#include <catch2/catch.hpp>

#include "dpar/autograd/function.h"
#include "gradcheck.h"

using namespace dpar;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

TEST_CASE("broadcasting arithmetic gradients", "[autograd]") {
  Generator gen(7);
  Tensor a = random_tensor({2, 3, 4}, gen).set_requires_grad();
  Tensor b = random_tensor({3, 1}, gen, 0.5f, 1.5f).set_requires_grad();
  gradcheck([](const std::vector<Tensor>& in) { return add(in[0], in[1]); }, {a, b});
  gradcheck([](const std::vector<Tensor>& in) { return sub(in[0], in[1]); }, {a, b});
  gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], in[1]); }, {a, b});
  gradcheck([](const std::vector<Tensor>& in) { return div(in[0], in[1]); }, {a, b});
  gradcheck([](const std::vector<Tensor>& in) { return mul(add(in[0], 2.0), -3.0); }, {a});
}

TEST_CASE("SE-style broadcast on channels-last", "[autograd]") {
  Generator gen(8);
  Tensor x =
      random_tensor({2, 3, 2, 2}, gen, -1, 1, MemoryFormat::ChannelsLast).set_requires_grad();
  Tensor s = random_tensor({2, 3, 1, 1}, gen).set_requires_grad();
  Tensor y = mul(x, s);
  CHECK(y.is_contiguous(MemoryFormat::ChannelsLast));
  gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], in[1]); }, {x, s});
}

TEST_CASE("the SE scale's gradient sums the product over many rows, in either layout",
          "[autograd]") {
  // 132 rows per image: several of the fused kernel's row blocks (channels-last), and the
  // product-then-sum path for NCHW; both against a double-precision sum.
  Generator gen(10);
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    Tensor x = random_tensor({3, 5, 12, 11}, gen, -1, 1, format).set_requires_grad();
    Tensor s = random_tensor({3, 5, 1, 1}, gen).set_requires_grad();
    Tensor g = random_tensor({3, 5, 12, 11}, gen, -1, 1, format);
    mul(x, s).backward(g);
    const Tensor xc = x.detach().contiguous(), gc = g.contiguous();
    const std::vector<float> xv = xc.to_float_vector(), gv = gc.to_float_vector();
    const std::vector<float> ds = s.grad().to_float_vector();
    for (int64_t nc = 0; nc < 15; ++nc) {
      double want = 0;
      for (int64_t p = 0; p < 132; ++p) want += double(xv[nc * 132 + p]) * gv[nc * 132 + p];
      CHECK(ds[static_cast<size_t>(nc)] == Approx(want).epsilon(1e-5).margin(1e-6));
    }
  }
}

TEST_CASE("an SE block's two gradients of x add up, the pooling's added in place", "[autograd]") {
  // x reaches the output through the multiply and through the pooling: the engine holds the
  // multiply's gradient when the pooling's backward runs, which adds into it (dense in x's
  // layout) instead of writing its own; both layouts, against finite differences.
  Generator gen(11);
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    Tensor x = random_tensor({2, 3, 3, 2}, gen, -1, 1, format).set_requires_grad();
    gradcheck(
        [](const std::vector<Tensor>& in) {
          return mul(in[0], hardsigmoid(global_avg_pool2d(in[0])));
        },
        {x});
  }
}

TEST_CASE("reductions and view gradients", "[autograd]") {
  Generator gen(9);
  Tensor x = random_tensor({2, 3, 4}, gen).set_requires_grad();
  gradcheck([](const std::vector<Tensor>& in) { return sum(in[0], {1}); }, {x});
  gradcheck([](const std::vector<Tensor>& in) { return mean(in[0], {0, 2}, true); }, {x});
  gradcheck([](const std::vector<Tensor>& in) { return mean(in[0]); }, {x});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return in[0].transpose(0, 2).reshape({4, 6});
      },
      {x});
  gradcheck([](const std::vector<Tensor>& in) { return in[0].slice(2, 1, 4, 2); }, {x});
  gradcheck([](const std::vector<Tensor>& in) { return in[0].select(1, 2); }, {x});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return in[0].permute({2, 0, 1}).contiguous();
      },
      {x});
  CHECK_THROWS_WITH(sum(x, {3}), Catch::Contains("dimension 3 out of range"));
}

TEST_CASE("gradients accumulate across backward calls", "[autograd]") {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad();
  sum(mul(w, w)).backward();
  CHECK(w.grad().to_float_vector() == std::vector<float>{2, 4});
  sum(mul(w, 3.0)).backward();
  CHECK(w.grad().to_float_vector() == std::vector<float>{5, 7});
}

TEST_CASE("a gradient reaching one input twice is summed without touching shared memory",
          "[autograd]") {
  // Residual form: h = f(x) feeds both branches, whose gradients meet at h (in place into the
  // first when its memory is its own).
  Generator gen(10);
  Tensor x = random_tensor({3, 4}, gen).set_requires_grad();
  gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor h = mul(in[0], 1.5);
        return add(h, mul(relu(h), h));
      },
      {x});
  // add's backward hands one tensor to both inputs: the second arrival must not be added
  // into the first (which is the same memory) - the gradient is 2, not 4.
  Tensor u = Tensor::from_vector(std::vector<float>{1, -2, 3}, {3}).set_requires_grad();
  sum(add(u, u)).backward();
  CHECK(u.grad().to_float_vector() == std::vector<float>{2, 2, 2});
  // The caller's gradient tensors for two roots on the same node stay as they were.
  Tensor v = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad();
  Tensor y = mul(v, 3.0);
  const Tensor g1 = Tensor::from_vector(std::vector<float>{1, 1}, {2});
  const Tensor g2 = Tensor::from_vector(std::vector<float>{10, 20}, {2});
  autograd::backward({y, y}, {g1, g2}, false);
  CHECK(g1.to_float_vector() == std::vector<float>{1, 1});
  CHECK(g2.to_float_vector() == std::vector<float>{10, 20});
  CHECK(v.grad().to_float_vector() == std::vector<float>{33, 63});
}

// y = x * 2 whose backward records what accumulation_target(0) offered and, when asked to,
// adds its gradient into the target and returns it.
Tensor doubled(const Tensor& x, bool use_target, std::vector<bool>& offered) {
  Tensor y = mul(x.detach(), 2.0);
  autograd::record("doubled", {x}, {y},
                   [use_target, &offered](const autograd::GradList& g, const autograd::NeedsGrad&) {
                     Tensor target = autograd::accumulation_target(0);
                     offered.push_back(target.defined());
                     Tensor gx = mul(g[0], 2.0);
                     if (use_target && target.defined()) {
                       add_(target, gx);
                       return autograd::GradList{target};
                     }
                     return autograd::GradList{gx};
                   });
  return y;
}

TEST_CASE("a backward may add into the gradient another path already delivered", "[autograd]") {
  const std::vector<float> start{1, -2, 3};
  for (const bool use_target : {false, true}) {
    std::vector<bool> offered;
    // h feeds `doubled` and, later in the graph, mul(h, 3): that backward runs first, so its
    // gradient (3 per element, a fresh tensor) is the target `doubled` is offered.
    Tensor x = Tensor::from_vector(start, {3}).set_requires_grad();
    Tensor h = mul(x, 1.0);
    Tensor d = doubled(h, use_target, offered);
    Tensor t = mul(h, 3.0);  // recorded after `doubled`, so its backward runs before
    sum(add(d, t)).backward();
    REQUIRE(offered == std::vector<bool>{true});
    CHECK(x.grad().to_float_vector() == std::vector<float>{5, 5, 5});  // counted once either way
  }
  // Nothing else delivered to h yet: no target.
  std::vector<bool> offered;
  Tensor x = Tensor::from_vector(start, {3}).set_requires_grad();
  Tensor single = doubled(mul(x, 1.0), true, offered);
  sum(single).backward();
  CHECK(offered == std::vector<bool>{false});
  CHECK(x.grad().to_float_vector() == std::vector<float>{2, 2, 2});
  // The first gradient to reach h is shared: add's backward hands the one tensor it received
  // (which the outer add also gave `doubled`) to both of its inputs. No target then.
  offered.clear();
  Tensor u = Tensor::from_vector(start, {3}).set_requires_grad();
  Tensor w = Tensor::from_vector(start, {3}).set_requires_grad();
  Tensor hu = mul(u, 1.0);
  Tensor d = doubled(hu, true, offered);
  Tensor z = add(hu, w);
  sum(add(d, z)).backward();
  CHECK(offered == std::vector<bool>{false});
  CHECK(u.grad().to_float_vector() == std::vector<float>{3, 3, 3});
  CHECK(w.grad().to_float_vector() == std::vector<float>{1, 1, 1});
}

TEST_CASE("no_grad records nothing", "[autograd]") {
  Tensor w = Tensor::ones({2}).set_requires_grad();
  Tensor y;
  {
    NoGradGuard guard;
    y = mul(w, 2.0);
  }
  CHECK_FALSE(y.requires_grad());
  CHECK(GradMode::is_enabled());
  CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("does not require grad"));
}

TEST_CASE("backward twice without retain_graph is an error", "[autograd]") {
  Tensor w = Tensor::ones({2}).set_requires_grad();
  Tensor loss = sum(mul(w, w));
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  CHECK(w.grad().to_float_vector() == std::vector<float>{4, 4});
  CHECK_THROWS_WITH(loss.backward(), Catch::Contains("retain_graph"));
}

TEST_CASE("gradient-ready hooks fire once per pass when the gradient is final", "[autograd]") {
  // a is used twice (two paths), b once, deeper in the graph: a's hook must fire only after
  // both contributions arrived, and carry the full gradient.
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad();
  Tensor b = Tensor::from_vector(std::vector<float>{3, 4}, {2}).set_requires_grad();
  std::vector<std::string> order;
  std::vector<float> a_grad_at_hook;
  a.register_grad_ready_hook([&](Tensor& p) {
    order.push_back("a");
    a_grad_at_hook = p.grad().to_float_vector();
  });
  const int hb = b.register_grad_ready_hook([&](Tensor&) { order.push_back("b"); });
  Tensor h = mul(a, b);                              // first use of a
  Tensor loss = sum(add(mul(h, 2.0), mul(a, 5.0)));  // second use of a, later in the graph
  loss.backward();
  REQUIRE(order.size() == 2);
  CHECK(a_grad_at_hook == std::vector<float>{2 * 3 + 5, 2 * 4 + 5});
  b.remove_grad_ready_hook(hb);
  sum(mul(a, b)).backward();
  CHECK(order.size() == 3);  // only a's hook remains
  CHECK_THROWS_WITH(h.register_grad_ready_hook([](Tensor&) {}), Catch::Contains("leaf"));
}

TEST_CASE("op argument errors name the op and shapes", "[autograd][errors]") {
  Tensor a = Tensor::ones({2, 3});
  Tensor b = Tensor::ones({4});
  CHECK_THROWS_WITH(add(a, b), Catch::Contains("add: shapes [2,3] and [4] cannot be broadcast"));
  CHECK_THROWS_WITH(mul(a, Tensor::ones({3}, DType::i64)),
                    Catch::Contains("mul: second operand has dtype i64"));
  CHECK_THROWS_AS(Tensor::ones({2}, DType::i64).set_requires_grad(), Error);
}

TEST_CASE("queued callbacks run once when backward finishes", "[autograd]") {
  Tensor w = Tensor::ones({2}).set_requires_grad();
  std::vector<std::string> events;
  w.register_grad_ready_hook([&](Tensor&) {
    events.push_back("hook");
    autograd::queue_callback([&] { events.push_back("final"); });
  });
  sum(mul(w, 2.0)).backward();
  CHECK(events == std::vector<std::string>{"hook", "final"});
  CHECK_FALSE(autograd::in_backward());
  CHECK_THROWS_WITH(autograd::queue_callback([] {}), Catch::Contains("outside a backward pass"));
}
