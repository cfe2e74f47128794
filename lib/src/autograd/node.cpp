#include "dpar/autograd/node.h"

#include <limits>

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"

namespace dpar::autograd {
namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node() : sequence_nr_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> variable)
    : variable_(std::move(variable)) {
  // Leaves run the moment they are ready so gradient-ready hooks fire as early as possible.
  sequence_nr_ = std::numeric_limits<uint64_t>::max();
  outputs_.push_back({variable_->shape, variable_->dtype, variable_->storage->device()});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor param(variable_);
  Tensor incoming = std::move(grads[0]);
  auto& meta = *variable_->autograd;
  if (!meta.grad) {
    // Keep the gradient in the parameter's layout; take ownership only when nobody else
    // can see the incoming buffer (it may be shared, e.g. add's backward passes one tensor on).
    const bool sole_owner =
        incoming.impl_ptr().use_count() == 1 && incoming.storage().use_count() == 1;
    if (sole_owner && incoming.strides() == param.strides() && incoming.dtype() == param.dtype()) {
      meta.grad = incoming.impl_ptr();
    } else {
      Tensor g = Tensor::empty_like(param);
      g.copy_(incoming);
      meta.grad = g.impl_ptr();
    }
  } else {
    // Accumulate in place: DataParallel's gradients are views into bucket memory.
    Tensor g(meta.grad);
    add_(g, incoming);
  }
  for (auto& [handle, hook] : meta.ready_hooks) hook(param);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.impl()->autograd) return {};
  auto& meta = *t.impl()->autograd;
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  if (!meta.requires_grad) return {};
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

}  // namespace dpar::autograd
