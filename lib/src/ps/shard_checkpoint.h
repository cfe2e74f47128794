#pragma once
// A parameter server's checkpoint: its shard, the optimizer state for it and where it stood,
// in one .safetensors file <dir>/pserver.<server id>.step<trainer step>.safetensors. The
// metadata records the layout (parameter names and sizes, block size, server count), the mode
// and the optimizer, so a resume into a different job is refused with the reason.
#include <cstdint>
#include <string>

#include "dpar/optim/optimizer.h"
#include "dpar/ps/layout.h"
#include "dpar/tensor/tensor.h"

namespace dpar::ps::detail {

struct ShardCheckpoint {
  int server_id = 0;
  int num_servers = 1;
  int64_t step = 0;     // the trainers' step count when it was taken
  int64_t version = 0;  // updates the server had applied
  ShardLayout layout;
  std::string mode;
  std::string optimizer;
  Tensor values;
  optim::StateDict optimizer_state;
};

std::string shard_checkpoint_path(const std::string& dir, int server_id, int64_t step);
// Writes atomically (temp file + rename) and, with keep > 0, removes this server's older
// checkpoints in dir beyond the newest `keep`. Returns the path.
std::string write_shard_checkpoint(const std::string& dir, const ShardCheckpoint& ckpt,
                                   int keep = 0);
// Throws dpar::Error naming the file when it is missing, corrupt or not a shard checkpoint.
ShardCheckpoint read_shard_checkpoint(const std::string& path);

}  // namespace dpar::ps::detail
