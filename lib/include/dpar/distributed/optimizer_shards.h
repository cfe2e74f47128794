#pragma once
// Optimizer checkpoints that load on any number of ranks.
//
// A shard set is a directory written by every rank of a job together:
//   index.json                      every slice of every state buffer: which parameter, which
//                                   elements, which file and tensor, its CRC-32C, its step
//   rank-<r>-of-<N>.safetensors     rank r's slices (one tensor per buffer and piece)
// Each rank writes its own file; rank 0 gathers the descriptions of every rank's slices, writes
// the index, and renames the finished set from "<dir>.tmp" to <dir>: a crash or a dead rank
// before that leaves "<dir>.tmp" behind and every earlier set untouched.
//
// Reading works for any layout: a rank of a job with another number of ranks (or sharding
// mode, or none) reads, from the files that hold them, only the pieces that overlap its own
// slices, checks each piece's CRC, and copies the overlap into place. Nothing is gathered on
// one rank. An unsharded optimizer state (a checkpoint's "optimizer.*" part) converts to any
// layout too, and back.
//
// Elements are counted in each parameter's memory order; the index records the parameter's
// strides, and loading into a parameter laid out differently (a GPU's channels-last weights
// into a CPU run) is an error naming it.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dpar/distributed/process_group.h"
#include "dpar/optim/optimizer.h"
#include "dpar/tensor/tensor.h"

namespace dpar::dist {

class DataParallel;

struct ParameterLayout {
  std::string name;  // the model's state-dict name
  Shape shape;
  Shape strides;
};

// Elements [begin, end) of parameter `parameter` (an index into OptimizerLayout::parameters)
// sit at [offset, offset + end - begin) of an optimizer tensor.
struct SlicePiece {
  size_t parameter = 0;
  int64_t begin = 0, end = 0, offset = 0;
};

// Where each tensor an optimizer updates lies in the model (DataParallel::optimizer_layout):
// whole parameters without sharding, this rank's bucket slices with it.
struct OptimizerLayout {
  std::vector<ParameterLayout> parameters;
  std::vector<std::vector<SlicePiece>> tensors;  // per optimizer tensor, in the optimizer's order
  // Each optimizer tensor's shape and strides (a whole parameter's, or a 1-D slice's): its
  // memory order is the order of its pieces' elements.
  std::vector<Shape> tensor_shapes, tensor_strides;
};

// The layout of an optimizer over whole parameters (a single process, or shard = none).
OptimizerLayout whole_parameter_layout(const std::vector<std::pair<std::string, Tensor>>& params);

// Writes opt's state (opt updates the tensors `layout` describes) as the shard set `dir`.
// Every rank of group calls it with its own layout; collective (group null: a single process).
// Throws (on every rank) naming the rank and the problem when a rank cannot write.
void save_optimizer_shards(const std::string& dir, const OptimizerLayout& layout,
                           const optim::Optimizer& opt, Group* group);
// The same for a state dict of an optimizer of kind optimizer_name (a state not loaded yet).
void save_optimizer_shards(const std::string& dir, const OptimizerLayout& layout,
                           const optim::StateDict& state, const std::string& optimizer_name,
                           Group* group);

// The state dict (keys "<buffer>.<i>", "step.<i>") of an optimizer of kind optimizer_name whose
// tensors `layout` describes, read from the shard set `dir` (written with any number of ranks
// and any layout). Throws naming the directory, file or piece on any problem: a missing or
// corrupt file, a CRC mismatch, another optimizer's state, elements no piece covers.
optim::StateDict read_optimizer_shards(const std::string& dir, const OptimizerLayout& layout,
                                       const std::string& optimizer_name);

// An unsharded state dict (keys "<buffer>.<i>" over the whole parameters `from`, e.g. a
// checkpoint's optimizer part) re-cut for `layout`; and the reverse, a layout's state
// assembled into whole parameters is what read_optimizer_shards gives for a whole-parameter
// layout.
optim::StateDict slice_optimizer_state(const optim::StateDict& whole, const OptimizerLayout& from,
                                       const OptimizerLayout& layout);

}  // namespace dpar::dist
