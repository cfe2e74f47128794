#pragma once
// libtorch optimizer state in dpar's state-dict form ("<buffer>.<i>", "step.<i>", with dpar's
// buffer names), so that it goes through the optimizer shard sets
// (dpar/distributed/optimizer_shards.h) and loads into dpar's optimizers of the same kind.
// i is the parameter's position in the optimizer's param groups, taken in order.
#include <torch/optim/optimizer.h>

#include <string>

#include "dpar/optim/optimizer.h"

namespace dpar::torch::internal {

// "SGD", "Adam", "AdamW" or "RMSprop" (dpar's optimizers' names); any other optimizer is a
// dpar::Error naming what is understood.
std::string optimizer_kind(const ::torch::optim::Optimizer& optimizer);
// The state of every parameter that has one, as dpar tensors sharing libtorch's memory.
optim::StateDict state_dict_of(const ::torch::optim::Optimizer& optimizer);
// Replaces the optimizer's state with `state` (every entry checked first: names, indices,
// shapes; a problem is a dpar::Error naming the entry and nothing changes).
void load_state_dict_into(::torch::optim::Optimizer& optimizer, const optim::StateDict& state);
// Bytes of the state's tensors.
size_t state_bytes_of(const ::torch::optim::Optimizer& optimizer);

}  // namespace dpar::torch::internal
