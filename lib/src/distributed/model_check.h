#pragma once
// The cross-rank model check of DataParallel (dpar's and dpar::torch's): every rank describes
// its parameters and buffers, and construction fails on every rank, with the same message
// naming the first difference, when they are not the same model.
#include <cstdint>
#include <string>
#include <vector>

#include "dpar/distributed/process_group.h"

namespace dpar::dist {

struct ModelSignature {
  std::vector<std::string> params, buffers;  // describe_model_entry lines, in model order
  std::string serialized() const;
};

// "features.3.weight f32[24,16,1,1]" (+ " frozen" for a parameter that needs no gradient).
std::string describe_model_entry(const std::string& name, const std::string& dtype,
                                 const std::vector<int64_t>& shape, bool frozen);

// Throws "DataParallel: parameter 3 differs across ranks: rank 0 has ..., rank 1 has ..." on
// every rank when the signatures differ; one small all-gather when they agree.
void verify_same_model(Group& group, const ModelSignature& mine);

}  // namespace dpar::dist
