#pragma once
// Checkpoints of a torch::nn::Module and its torch::optim optimizer in dpar's checkpoint format
// (dpar/io/checkpoint.h): one .safetensors file whose model.<name> entries are the module's
// parameters and buffers (readable by any safetensors tool, and by PyTorch's safetensors
// loader), whose optimizer part is the optimizer's own serialized archive (momentum buffers,
// Adam moments, step counts: exactly what optimizer.load() restores), with the training
// position and libtorch's CPU generator state, all under dpar's CRC-32, written atomically
// (tmp file, fsync, rename). A resumed run continues bitwise where the saved one stopped.
//
// The io::Checkpoint these make also goes through io::CheckpointManager (per-epoch files,
// rotation, latest/best, the newest valid file on resume).
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "dpar/io/checkpoint.h"

namespace dpar::torch {

// The module's state and the optimizer's (may be null), with state's position. The model
// tensors share memory with the module, as io::capture_checkpoint's do: save (or clone) before
// the next step. The parameters and buffers must
// have dpar dtypes (float32, float16, bfloat16, int64, uint8); others are an error naming them.
io::Checkpoint capture_checkpoint(const ::torch::nn::Module& module,
                                  ::torch::optim::Optimizer* optimizer,
                                  io::TrainingState state = {});
// Loads a checkpoint into module (every name and shape must match, or a dpar::Error lists the
// differences and nothing is loaded) and optimizer (when both it and the checkpoint have one),
// and restores libtorch's CPU generator. Returns the training position.
io::TrainingState restore_checkpoint(const io::Checkpoint& checkpoint, ::torch::nn::Module& module,
                                     ::torch::optim::Optimizer* optimizer);

// Rank 0 (dpar::dist::get_rank()) writes path; other ranks do nothing. Atomic and CRC-checked.
void save_checkpoint(const std::string& path, const ::torch::nn::Module& module,
                     ::torch::optim::Optimizer* optimizer, io::TrainingState state = {});
// Rank 0 reads and verifies path and every rank restores what it read (the tensors travel over
// the default group; only rank 0 needs the file). A missing, torn or corrupted file is a
// dpar::Error naming it, on every rank.
io::TrainingState load_checkpoint(const std::string& path, ::torch::nn::Module& module,
                                  ::torch::optim::Optimizer* optimizer);

}  // namespace dpar::torch
