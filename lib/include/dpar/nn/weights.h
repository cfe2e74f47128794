#pragma once
// A module's state dict as a .safetensors file, named exactly like torch's state_dict(), so
// weights trained here load into torchvision and the other way round.
#include <string>

#include "dpar/io/safetensors.h"
#include "dpar/nn/module.h"

namespace dpar::nn {

// Writes module.state_dict() (parameters and buffers, in state-dict order).
void save_weights(const Module& module, const std::string& path, const io::Metadata& metadata = {});

// Loads a file written by save_weights (or by PyTorch tooling) into module in place.
// strict: a dpar::Error naming the file and every missing, unexpected or mis-shaped tensor,
// and nothing is loaded. Not strict: loads what matches and returns the report.
LoadReport load_weights(Module& module, const std::string& path, bool strict = true);

}  // namespace dpar::nn
