#pragma once
// Kernel slots for the fused optimizer updates: each reads and writes every operand once per
// step. Operands are f32 tensors on one device sharing one dense layout (same strides), so a
// kernel may treat them as flat arrays of numel() elements. Undefined tensors mark unused
// state (no momentum, not centered). Scalars are precomputed in double by the optimizer and
// passed as the float values PyTorch's kernels use, so results match torch to rounding.
//
// The *_multi slots update many parameters of one device in one call (PyTorch's foreach /
// fused optimizers): on CUDA a step then costs one kernel launch instead of one per parameter.
// Each item follows the single-tensor rules and gets the single-tensor kernel's per-element
// math, so results are bitwise equal to calling the single-tensor slot once per item. Items
// must not share memory. Only CUDA fills them; the CPU runs the single-tensor slots.
#include <vector>

#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

struct SgdStepArgs {
  float lr = 0;
  float momentum = 0;
  float one_minus_dampening = 1;
  float weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is uninitialised: set it to the gradient
};
DPAR_KERNEL(sgd_step, void(Tensor& param, const Tensor& grad, Tensor& momentum_buffer,
                           const SgdStepArgs& args));

struct SgdStepItem {
  Tensor param;
  Tensor grad;
  Tensor momentum_buffer;   // undefined without momentum
  bool first_step = false;  // per parameter: used instead of args.first_step
};
DPAR_KERNEL(sgd_step_multi, void(std::vector<SgdStepItem>& items, const SgdStepArgs& args));

struct RmspropStepArgs {
  float lr = 0;
  float alpha = 0;
  float one_minus_alpha = 0;
  float eps = 0;
  float weight_decay = 0;
  float momentum = 0;
};
// grad_avg is defined only when centered, momentum_buffer only when momentum > 0.
DPAR_KERNEL(rmsprop_step,
            void(Tensor& param, const Tensor& grad, Tensor& square_avg, Tensor& grad_avg,
                 Tensor& momentum_buffer, const RmspropStepArgs& args));

struct RmspropStepItem {
  Tensor param;
  Tensor grad;
  Tensor square_avg;
  Tensor grad_avg;         // undefined unless centered
  Tensor momentum_buffer;  // undefined unless momentum > 0
};
DPAR_KERNEL(rmsprop_step_multi,
            void(std::vector<RmspropStepItem>& items, const RmspropStepArgs& args));

struct AdamwStepArgs {
  float decay = 1;  // 1 - lr * weight_decay
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float step_size = 0;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1;  // sqrt(1 - beta2^t)
  float eps = 0;
};
DPAR_KERNEL(adamw_step, void(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                             const AdamwStepArgs& args));

// The bias corrections depend on each parameter's own step count, so they are per item;
// args.step_size and args.bias_correction2_sqrt are not read.
struct AdamwStepItem {
  Tensor param;
  Tensor grad;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  float step_size = 0;
  float bias_correction2_sqrt = 1;
};
DPAR_KERNEL(adamw_step_multi, void(std::vector<AdamwStepItem>& items, const AdamwStepArgs& args));

}  // namespace dpar::kernels
