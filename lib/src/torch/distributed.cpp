#include "dpar/torch/distributed.h"

#include "dpar/torch/tensor.h"

namespace dpar::torch {
namespace {

Group& group_or_default(Group* group, const char* op) {
  if (group) return *group;
  DPAR_CHECK(dist::is_initialized(), "dpar::torch::", op,
             ": no process group; call dpar::dist::init_parallel_env() first (or pass a group)");
  return dist::default_group();
}

std::vector<Tensor> views_of(const std::vector<at::Tensor>& tensors) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(to_dpar(t));
  return out;
}

}  // namespace

std::shared_ptr<Work> all_reduce(const at::Tensor& tensor, ReduceOp op, bool async_op,
                                 Group* group) {
  return group_or_default(group, "all_reduce").allreduce({to_dpar(tensor)}, op, async_op);
}

std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int src, bool async_op, Group* group) {
  return group_or_default(group, "broadcast").broadcast({to_dpar(tensor)}, src, async_op);
}

std::shared_ptr<Work> all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                 bool async_op, Group* group) {
  return group_or_default(group, "all_gather")
      .allgather(views_of(outputs), to_dpar(input), async_op);
}

std::shared_ptr<Work> reduce_scatter(const at::Tensor& output,
                                     const std::vector<at::Tensor>& inputs, ReduceOp op,
                                     bool async_op, Group* group) {
  return group_or_default(group, "reduce_scatter")
      .reduce_scatter(to_dpar(output), views_of(inputs), op, async_op);
}

void barrier(Group* group) { group_or_default(group, "barrier").barrier(); }

}  // namespace dpar::torch
