#pragma once
// Collectives on libtorch tensors through dpar's process groups (dpar::torch).
//
// The tensors are viewed, not copied (dpar/torch/tensor.h): a collective works in place on the
// libtorch tensor's memory, through the same groups, timeouts, DPAR_DEBUG=DETAIL cross-rank
// checks and error lines as collectives on dpar tensors. group == nullptr means the default
// group of dpar::dist::init_parallel_env(). With async_op the returned Work completes later
// (wait() rethrows the collective's failure, naming op, ranks and shapes); it holds the
// tensors' memory until then. Without async_op the collective has finished on return.
#include <torch/types.h>

#include <memory>
#include <vector>

#include "dpar/distributed/parallel_env.h"
#include "dpar/distributed/process_group.h"

namespace dpar::torch {

using dist::Group;
using dist::ReduceOp;
using dist::Work;

// In place: every rank ends with the reduction of every rank's tensor.
std::shared_ptr<Work> all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::Sum,
                                 bool async_op = false, Group* group = nullptr);
// In place: src's values on every rank.
std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int src = 0, bool async_op = false,
                                Group* group = nullptr);
// outputs[r] receives rank r's input (outputs: world size tensors shaped like input).
std::shared_ptr<Work> all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                 bool async_op = false, Group* group = nullptr);
// output = the reduction over ranks of inputs[rank] (inputs: world size tensors).
std::shared_ptr<Work> reduce_scatter(const at::Tensor& output,
                                     const std::vector<at::Tensor>& inputs,
                                     ReduceOp op = ReduceOp::Sum, bool async_op = false,
                                     Group* group = nullptr);
void barrier(Group* group = nullptr);

}  // namespace dpar::torch
