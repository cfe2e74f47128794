#pragma once
// The half-precision activation checks shared by the CPU (bf16, tests/unit/test_cpu_bf16_ops)
// and the GPU (f16 and bf16, tests/gpu/test_cuda_half_ops): every op amp::Autocast hands
// f16/bf16 tensors to (adds and products with broadcasting, activations, dropout, BatchNorm
// with its activation, global pooling, the reductions behind broadcast gradients) computes in
// f32 and rounds once at the store, so on inputs that are exactly representable in the half
// type it must match the same op in f32 to the output's rounding, forward and backward, and
// hand back gradients in each input's dtype. Then the dtype rules between ops: autocast results
// stay in half precision, f32-only ops (softmax, the losses, reductions) take them as f32,
// mixed operands meet in f32; and MobileNetV3-small trains a step under autocast close to its
// f32 step. One policy, one set of checks, on both backends.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "dpar/dpar.h"
#include "mobilenetv3/model/mobilenet_v3.h"
#include "tensor_compare.h"

namespace half_checks {

using namespace dpar;
using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// One rounding of the output, plus the rounding of gradients that pass through a few ops: f16
// has 11 significant bits (4.9e-4 per rounding), bf16 8 (3.9e-3).
inline double tolerance(DType dtype) { return dtype == DType::f16 ? 4e-3 : 3e-2; }

// t rounded to dtype and back: the f32 reference then sees the half run's exact inputs.
inline Tensor rounded(const Tensor& t, DType dtype) { return t.to(dtype).to(DType::f32); }

// Runs op on half inputs and on the same values in f32 (both on `device`); checks the output's
// dtype and values, then the gradients of sum(out * r), which must come back in the dtype of
// each input. channels_last: 4-D inputs in that layout (as the model's activations are).
inline void half_matches_f32(const char* name, Device device, DType dtype, const OpFn& op,
                             const std::vector<Tensor>& inputs, bool channels_last = false) {
  INFO(name << " in " << dtype_name(dtype) << " on " << device);
  std::vector<Tensor> in32, inh;
  for (const Tensor& t : inputs) {
    Tensor r = rounded(t, dtype);
    if (channels_last && r.dim() == 4) r = r.contiguous(MemoryFormat::ChannelsLast);
    in32.push_back(leaf_on(r, device));
    Tensor h = r.to(device).to(dtype);
    h.set_requires_grad(true);
    inh.push_back(h);
  }
  const Tensor out32 = op(in32), outh = op(inh);
  CHECK(outh.dtype() == dtype);
  CHECK(relative_error(out32, outh) <= tolerance(dtype));
  const Tensor r = random_tensor(out32.shape(), 77).to(device);
  sum(mul(out32, r)).backward();
  sum(mul(outh, r)).backward();  // half * f32 meets in f32
  for (size_t i = 0; i < inputs.size(); ++i) {
    INFO("gradient of input " << i);
    REQUIRE(inh[i].grad().defined());
    CHECK(inh[i].grad().dtype() == dtype);
    CHECK(relative_error(in32[i].grad(), inh[i].grad()) <= 2 * tolerance(dtype));
  }
}

// adds and products with same shapes, strided operands and SE-gate broadcasts.
inline void check_adds_and_products(Device device, const std::vector<DType>& dtypes) {
  const Tensor a = random_tensor({4, 24, 7, 7}, 1), b = random_tensor({4, 24, 7, 7}, 2);
  const Tensor gate = random_tensor({4, 24, 1, 1}, 3, 0.f, 1.f);
  const Tensor bias = random_tensor({1, 24, 1, 1}, 4);
  for (DType dt : dtypes) {
    half_matches_f32(
        "add", device, dt, [](const auto& in) { return add(in[0], in[1]); }, {a, b}, true);
    half_matches_f32("sub", device, dt, [](const auto& in) { return sub(in[0], in[1]); }, {a, b});
    half_matches_f32("div", device, dt, [](const auto& in) { return div(in[0], add(in[1], 3.0)); },
                     {a, b});
    // The SE block's x * gate (channels-last, one value per sample and channel) and a bias
    // broadcast over N, H and W: their gradients are reductions (sum_to) in the half type.
    half_matches_f32(
        "mul by a gate", device, dt, [](const auto& in) { return mul(in[0], in[1]); }, {a, gate},
        true);
    half_matches_f32(
        "add a bias", device, dt, [](const auto& in) { return add(in[1], in[0]); }, {a, bias},
        true);
    // A transposed (non-dense) operand takes the strided kernels.
    half_matches_f32("mul transposed", device, dt,
                     [](const auto& in) { return mul(in[0].transpose(2, 3), in[1]); }, {a, b});
    half_matches_f32("scalar affine", device, dt,
                     [](const auto& in) { return add(mul(in[0], 0.5), 1.0); }, {a});
  }
}

// activations and dropout.
inline void check_activations(Device device, const std::vector<DType>& dtypes) {
  const Tensor x = random_tensor({4, 16, 9, 9}, 5, -4.f, 4.f);
  for (DType dt : dtypes) {
    half_matches_f32(
        "relu", device, dt, [](const auto& in) { return relu(in[0]); }, {x}, true);
    half_matches_f32(
        "hardswish", device, dt, [](const auto& in) { return hardswish(in[0]); }, {x}, true);
    half_matches_f32("hardsigmoid", device, dt, [](const auto& in) { return hardsigmoid(in[0]); },
                     {x});
    half_matches_f32("sigmoid", device, dt, [](const auto& in) { return sigmoid(in[0]); }, {x});
    half_matches_f32("gelu", device, dt, [](const auto& in) { return gelu(in[0]); }, {x});
    // The same generator state draws the same mask in both runs.
    half_matches_f32("dropout", device, dt,
                     [](const auto& in) {
                       Generator gen(11);
                       return dropout(in[0], 0.3, true, gen);
                     },
                     {x});
  }
}

// BatchNorm with its activation: f32 statistics and parameters.
inline void check_batch_norm(Device device, const std::vector<DType>& dtypes) {
  // Weights and biases that keep the normalised values inside (-3, 3): where y sits within a
  // rounding of hardswish's kinks at +-3, its derivative jumps by 0.5 between the f32 and the
  // half run (with weights in [0.5, 1.5) one or two of these 25600 values did, and dx differed
  // by 0.31 relative on an H200). ReLU's kink at 0 survives rounding (the sign is kept).
  const Tensor x = random_tensor({8, 32, 10, 10}, 6, -2.f, 3.f);
  const Tensor w = random_tensor({32}, 7, 0.2f, 0.6f), b = random_tensor({32}, 8, -0.3f, 0.3f);
  for (DType dt : dtypes) {
    for (Activation act : {Activation::none, Activation::relu, Activation::hardswish}) {
      INFO("activation " << static_cast<int>(act));
      // The parameters stay f32 leaves: their gradients are f32 whatever x's dtype.
      Tensor w32 = leaf_on(w, device), b32 = leaf_on(b, device);
      Tensor wh = leaf_on(w, device), bh = leaf_on(b, device);
      Tensor rm32 = Tensor::zeros({32}, DType::f32, device),
             rv32 = Tensor::ones({32}, DType::f32, device);
      Tensor rmh = rm32.clone(), rvh = rv32.clone();
      half_matches_f32(
          "batch_norm_act", device, dt,
          [&](const auto& in) {
            const bool half = in[0].dtype() != DType::f32;
            return batch_norm_act(in[0], half ? wh : w32, half ? bh : b32, half ? rmh : rm32,
                                  half ? rvh : rv32, true, 0.1, 1e-5, act);
          },
          {x}, true);
      CHECK(wh.grad().dtype() == DType::f32);
      CHECK(relative_error(w32.grad(), wh.grad()) <= 2 * tolerance(dt));
      CHECK(relative_error(b32.grad(), bh.grad()) <= 2 * tolerance(dt));
      CHECK(relative_error(rm32, rmh) <= tolerance(dt));
      CHECK(relative_error(rv32, rvh) <= tolerance(dt));
    }
  }
}

// global average pooling in both layouts.
inline void check_global_pooling(Device device, const std::vector<DType>& dtypes) {
  const Tensor x = random_tensor({4, 40, 7, 7}, 9);
  for (DType dt : dtypes) {
    half_matches_f32(
        "global_avg_pool2d nhwc", device, dt,
        [](const auto& in) { return global_avg_pool2d(in[0]); }, {x}, true);
    half_matches_f32(
        "global_avg_pool2d nchw", device, dt,
        [](const auto& in) { return global_avg_pool2d(in[0]); }, {x}, false);
  }
}

// the dtypes between ops under autocast.
inline void check_dtypes_between_ops(Device device, const std::vector<DType>& dtypes) {
  for (DType dt : dtypes) {
    INFO(dtype_name(dt));
    Tensor x = leaf_on(random_tensor({4, 8, 12, 12}, 10), device);
    Tensor w = leaf_on(random_tensor({16, 8, 3, 3}, 11, -0.2f, 0.2f), device);
    Tensor b = leaf_on(random_tensor({16}, 12), device);
    Tensor lw = leaf_on(random_tensor({10, 16}, 13), device);
    const Tensor target = Tensor::from_vector(std::vector<int64_t>{1, 3, 5, 7}, {4}).to(device);
    Tensor logits, loss;
    {
      amp::Autocast autocast(dt);
      const Tensor y = conv2d(x, w, b, {.padding = {1, 1}});
      CHECK(y.dtype() == dt);  // torch.autocast's rule: the result stays in the compute dtype
      const Tensor pooled = global_avg_pool2d(relu(y)).flatten(1);
      CHECK(pooled.dtype() == dt);
      logits = linear(pooled, lw, Tensor());
      CHECK(logits.dtype() == dt);
      loss = cross_entropy(logits, target);  // fp32 list: computed in f32
      CHECK(loss.dtype() == DType::f32);
    }
    // An f32 tensor meeting a half one: both go to f32.
    const Tensor mixed = add(logits, Tensor::ones({4, 10}, DType::f32, device));
    CHECK(mixed.dtype() == DType::f32);
    CHECK(sum(logits).dtype() == DType::f32);
    loss.backward();
    // Leaves get gradients in their own dtype: the f32 input and master weights in f32.
    CHECK(x.grad().dtype() == DType::f32);
    CHECK(w.grad().dtype() == DType::f32);
    CHECK(b.grad().dtype() == DType::f32);
    CHECK(lw.grad().dtype() == DType::f32);
    CHECK(std::isfinite(loss.item()));
  }
}

// one MobileNetV3-small training step under autocast against the f32 step.
inline void check_mobilenet_step(Device device, const std::vector<DType>& dtypes) {
  std::vector<int64_t> labels(16);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  const Tensor images = random_tensor({16, 3, 64, 64}, 21).to(device);
  const Tensor target = Tensor::from_vector(labels, {16}).to(device);
  auto step = [&](std::optional<DType> dtype) {
    manual_seed(7);
    auto model = models::mobilenet_v3("mobilenet_v3_small", 10);
    model->train();
    model->to(device);
    Tensor loss;
    {
      amp::Autocast autocast(dtype.value_or(DType::f32), dtype.has_value());
      loss = cross_entropy(model->forward(images), target);
    }
    loss.backward();
    std::vector<Tensor> grads;
    for (const Tensor& p : model->parameters()) grads.push_back(p.grad());
    return std::pair{loss.item(), grads};
  };
  const auto [loss32, grads32] = step(std::nullopt);
  for (DType dt : dtypes) {
    INFO(dtype_name(dt));
    const auto [loss, grads] = step(dt);
    CHECK(std::fabs(loss - loss32) <= 0.02 * std::fabs(loss32));
    REQUIRE(grads.size() == grads32.size());
    // The classifier's weight gradient: every layer's rounding reaches it.
    const Tensor& g32 = grads32[grads32.size() - 2];
    const Tensor& g = grads[grads.size() - 2];
    CHECK(g.dtype() == DType::f32);
    CHECK(relative_error(g32, g) <= 0.1);
  }
}

}  // namespace half_checks
