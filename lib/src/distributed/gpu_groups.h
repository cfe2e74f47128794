#pragma once
// The backends Group uses for CUDA tensors: NCCL (CUDA builds), or Gloo with host staging.
#include <memory>

#include "dpar/distributed/process_group.h"

namespace dpar::dist::detail {

// The NCCL group (nccl/process_group_nccl.h). In a build without CUDA it throws dpar::Error.
std::shared_ptr<ProcessGroup> make_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                              const ProcessGroupOptions& options);

// CUDA tensors over an existing Gloo group, as PyTorch's Gloo backend does: each collective
// copies its tensors to host memory, runs on `gloo`, and copies the results back to the
// device when the Work is waited for (so wait() must be called, as with any async result).
// Slower than NCCL, but it runs where NCCL cannot: no NCCL, or several ranks on one GPU.
std::shared_ptr<ProcessGroup> make_staged_gloo_group(std::shared_ptr<ProcessGroup> gloo);

}  // namespace dpar::dist::detail
