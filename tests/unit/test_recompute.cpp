// Activations recomputed in backward (autograd::SavedTensor): a batch norm + activation's output
// read by a convolution, and the SE multiply's product read by the next convolution, are kept as
// recipes, freed after the forward and made again in backward with the same bits (the SE
// multiply keeps its activation operand, which both its backward and the product's recipe read);
// and the CPU caching allocator's bound on what it holds.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>

#include "dpar/autograd/function.h"
#include "dpar/tensor/allocator.h"
#include "dpar/tensor/ops.h"
#include "gradcheck.h"

using namespace dpar;
using dpar::testing::random_tensor;

namespace {

struct Block {
  Tensor x, w1, gamma, beta, wd, gamma2, beta2, se, w2, r;
};

Block make_block() {
  Generator gen(11);
  Block b;
  b.x = random_tensor({2, 8, 10, 10}, gen).contiguous(MemoryFormat::ChannelsLast);
  b.x.set_requires_grad();
  b.w1 = random_tensor({16, 8, 1, 1}, gen).set_requires_grad();
  b.gamma = random_tensor({16}, gen, 0.5f, 1.5f).set_requires_grad();  // away from zero
  b.beta = random_tensor({16}, gen).set_requires_grad();
  b.wd = random_tensor({16, 1, 3, 3}, gen).set_requires_grad();
  b.gamma2 = random_tensor({16}, gen, 0.5f, 1.5f).set_requires_grad();
  b.beta2 = random_tensor({16}, gen).set_requires_grad();
  b.se = random_tensor({2, 16, 1, 1}, gen, 0.1f, 1.0f).set_requires_grad();
  b.w2 = random_tensor({4, 16, 3, 3}, gen).set_requires_grad();
  b.r = random_tensor({2, 4, 10, 10}, gen);
  return b;
}

struct Run {
  std::vector<std::vector<float>> grads;
  // Whether each tensor's storage was freed once the forward's locals were gone, before backward.
  bool activation_freed = false, se_activation_freed = false, product_freed = false;
};

// conv 1x1 -> batch norm + hardswish -> depthwise 3x3 conv -> batch norm + ReLU -> SE-style
// multiply -> 3x3 conv, then a weighted sum.
Run run_block(bool recompute) {
  autograd::set_recompute_enabled(recompute);
  Block b = make_block();
  Tensor running_mean = Tensor::zeros({16}), running_var = Tensor::ones({16});
  Tensor running_mean2 = Tensor::zeros({16}), running_var2 = Tensor::ones({16});
  Run run;
  Tensor loss;
  std::weak_ptr<Storage> activation, se_activation, product;
  {
    Tensor y = conv2d(b.x, b.w1, Tensor(), {});
    Tensor z = batch_norm_act(y, b.gamma, b.beta, running_mean, running_var, /*training=*/true, 0.1,
                              1e-3, Activation::hardswish);
    Tensor yd = conv2d(z, b.wd, Tensor(), {.padding = {1, 1}, .groups = 16});
    Tensor zd = batch_norm_act(yd, b.gamma2, b.beta2, running_mean2, running_var2, true, 0.1, 1e-3,
                               Activation::relu);
    Tensor p = mul(b.se, zd);
    Tensor out = conv2d(p, b.w2, Tensor(), {.padding = {1, 1}});
    loss = sum(mul(out, b.r));
    activation = z.storage();
    se_activation = zd.storage();
    product = p.storage();
  }
  run.activation_freed = activation.expired();
  run.se_activation_freed = se_activation.expired();
  run.product_freed = product.expired();
  loss.backward();
  for (const Tensor& t : {b.x, b.w1, b.gamma, b.beta, b.wd, b.gamma2, b.beta2, b.se, b.w2})
    run.grads.push_back(t.grad().to_float_vector());
  autograd::set_recompute_enabled(true);
  return run;
}

}  // namespace

TEST_CASE("recomputed activations free their memory and give bitwise the kept ones' gradients",
          "[autograd][recompute]") {
  const Run kept = run_block(false);
  const Run recomputed = run_block(true);
  // Kept: the graph held the activations and the product until backward freed them;
  // recomputed: nothing held the convolution's input or the product once the forward's locals
  // were gone, while the SE multiply held its activation operand.
  CHECK(recomputed.activation_freed);
  CHECK(recomputed.product_freed);
  CHECK_FALSE(recomputed.se_activation_freed);
  CHECK_FALSE(kept.activation_freed);
  CHECK_FALSE(kept.se_activation_freed);
  CHECK_FALSE(kept.product_freed);
  REQUIRE(kept.grads.size() == recomputed.grads.size());
  for (size_t i = 0; i < kept.grads.size(); ++i) {
    INFO("gradient " << i);
    REQUIRE(kept.grads[i].size() == recomputed.grads[i].size());
    CHECK(std::memcmp(kept.grads[i].data(), recomputed.grads[i].data(),
                      kept.grads[i].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("with recomputation off the graph keeps the activation until backward",
          "[autograd][recompute]") {
  autograd::set_recompute_enabled(false);
  Block b = make_block();
  Tensor running_mean = Tensor::zeros({16}), running_var = Tensor::ones({16});
  std::weak_ptr<Storage> activation;
  Tensor loss;
  {
    Tensor z = batch_norm_act(conv2d(b.x, b.w1, Tensor(), {}), b.gamma, b.beta, running_mean,
                              running_var, true, 0.1, 1e-3, Activation::hardswish);
    loss = sum(mul(conv2d(z, b.w2, Tensor(), {.padding = {1, 1}}), b.r));
    activation = z.storage();
  }
  autograd::set_recompute_enabled(true);
  CHECK_FALSE(activation.expired());
  loss.backward();
  CHECK(activation.expired());
}

TEST_CASE("an activation written in place is kept, not remade from before the write",
          "[autograd][recompute]") {
  // z *= 2 in place after the batch norm, then a convolution reads z: its weight gradient must
  // use the written values, which a recipe from y would not give.
  std::vector<float> grads[2];
  for (bool recompute : {false, true}) {
    autograd::set_recompute_enabled(recompute);
    Block b = make_block();
    Tensor running_mean = Tensor::zeros({16}), running_var = Tensor::ones({16});
    Tensor z = batch_norm_act(conv2d(b.x, b.w1, Tensor(), {}), b.gamma, b.beta, running_mean,
                              running_var, true, 0.1, 1e-3, Activation::hardswish);
    mul_(z, 2.0);
    sum(mul(conv2d(z, b.w2, Tensor(), {.padding = {1, 1}}), b.r)).backward();
    grads[recompute ? 1 : 0] = b.w2.grad().to_float_vector();
  }
  autograd::set_recompute_enabled(true);
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("the CPU allocator's cache stays within its bound of the peak in use", "[allocator]") {
  // Blocks of growing sizes, each freed before the next: an unbounded cache would keep every
  // one (the sum of all sizes); the bound keeps what it holds near the largest.
  Allocator& cpu = allocator_for(Device::cpu());
  cpu.empty_cache();
  cpu.reset_peak_stats();
  const size_t base = cpu.stats().allocated_bytes;
  size_t total = 0;
  for (size_t mb = 1; mb <= 12; ++mb) {
    void* p = cpu.allocate(mb << 20, Device::cpu());
    std::memset(p, 1, mb << 20);
    cpu.deallocate(p, mb << 20);
    total += mb << 20;
  }
  const AllocatorStats s = cpu.stats();
  const size_t held = s.allocated_bytes + s.cached_bytes - base;
  INFO("held " << held << " bytes after blocks totalling " << total);
  CHECK(held <= static_cast<size_t>(1.4 * static_cast<double>(s.peak_allocated_bytes)));
  CHECK(held < total / 2);
  // The steady state allocates nothing: the same request again is served from the cache.
  const uint64_t before = cpu.stats().system_allocations;
  void* again = cpu.allocate(12 << 20, Device::cpu());
  cpu.deallocate(again, 12 << 20);
  CHECK(cpu.stats().system_allocations == before);
}
