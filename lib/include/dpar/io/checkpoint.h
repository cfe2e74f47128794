#pragma once
// Training checkpoints: everything a run needs to continue exactly where it stopped.
//
// A checkpoint is a .safetensors file (readable by any safetensors tool) holding
//   model.<name>      the model's state dict (parameters and buffers),
//   optimizer.<key>   the optimizer's state dict (momentum buffers, step counts, ...),
//   scheduler.<key>   the LR scheduler's state,
// and three metadata strings: "format" = "dpar.checkpoint", "dpar.checkpoint" = the JSON of a
// TrainingState (epoch, step, sampler position, RNG states, ...) and "dpar.checksum" = a CRC-32
// over every tensor's name, dtype, shape and bytes plus that JSON text. Files are written to
// "<path>.tmp", fsynced, renamed over path and the directory is fsynced, so a crash leaves
// either the old file or the new one; a torn or corrupted file fails the checksum or the
// format checks on load with a dpar::Error naming the file and the problem.
//
// CheckpointManager lays out a directory the way PaddlePaddle's CheckpointConfig users
// expect: per-epoch files model_{epoch}.ckpt, step checkpoints step_{global_step}.ckpt, the
// newest N of those kept, plus latest.ckpt and best.ckpt (hard links when the file system
// allows, else copies). Only rank 0 writes.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dpar/core/progress.h"
#include "dpar/nn/module.h"
#include "dpar/optim/lr_scheduler.h"
#include "dpar/optim/optimizer.h"

namespace dpar::io {

inline constexpr const char* kCheckpointExtension = ".ckpt";
// A checkpoint of a sharded run keeps its optimizer state beside it, as the shard set (see
// dpar/distributed/optimizer_shards.h) that TrainingState::extra[kOptimizerShardsKey] names,
// a folder of the checkpoint's folder.
inline constexpr const char* kOptimizerShardsKey = "optimizer_shards";

// Where a run stands. Positions count what is already done: a checkpoint written after the
// 5th batch of epoch 2 has epoch 2, step_in_epoch 5; one written after epoch 2 finished
// (its evaluation included) has epoch 3, step_in_epoch 0.
struct TrainingState {
  std::string model_name;
  int64_t epoch = 0;             // the epoch to continue (0-based)
  int64_t step_in_epoch = 0;     // batches of `epoch` already trained, 0..steps_per_epoch
  int64_t global_step = 0;       // optimizer steps taken in all
  int64_t sampler_position = 0;  // examples of `epoch` each rank has consumed
  int64_t steps_per_epoch = 0;
  int64_t batch_size = 0;  // per rank
  int64_t world_size = 1;
  uint64_t seed = 0;      // sampler and data-loader seed (samples are seeded by seed, epoch, index)
  double best_top1 = -1;  // best validation top-1 so far; -1 before the first evaluation
  int64_t best_epoch = -1;  // the epoch that reached it
  // Generator states by name (Generator::state()); capture_checkpoint() records "default",
  // the process-wide generator (dropout), and restore_checkpoint() restores it.
  std::map<std::string, std::string> rng;
  std::map<std::string, std::string> extra;  // free-form facts (optimizer/scheduler names, ...)
  std::string dpar_version;                  // filled by capture_checkpoint()
  std::string git_commit;
};

struct Checkpoint {
  TrainingState state;
  nn::NamedTensors model;      // state-dict names, without the "model." prefix
  nn::NamedTensors optimizer;  // optimizer state-dict keys
  nn::NamedTensors scheduler;  // scheduler state-dict keys
};

// Gathers the state of a training run. The tensors share memory with the live objects: save
// (or clone) before the next step. optimizer and scheduler may be null. Records the
// optimizer's name, the default generator's state and the dpar version into state.
Checkpoint capture_checkpoint(const nn::Module& model, const optim::Optimizer* optimizer,
                              const optim::LRScheduler* scheduler, TrainingState state);

// Puts a checkpoint back: model, optimizer and scheduler state and the default generator.
// Everything is checked before anything changes: a checkpoint of another model throws one
// dpar::Error naming `source` and listing the missing / unexpected / mis-shaped entries; an
// optimizer of another kind or with other options is an error naming both kinds.
void restore_checkpoint(const Checkpoint& checkpoint, nn::Module& model,
                        optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                        const std::string& source);

// The compact one-line description of a state-dict mismatch used by restore_checkpoint():
// "3 missing (a, b, c), 2 unexpected (...), 1 mis-shaped (w: model [4,3] vs checkpoint [5,3])",
// at most `listed` names per kind.
std::string describe_mismatch(const nn::LoadReport& report, size_t listed = 6);

// Atomic, durable write (tmp file, fsync, rename, fsync of the directory). progress hears
// (bytes written, bytes in all) as the file is written.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     const ProgressCallback& progress = {});

// Reads and verifies a checkpoint; any problem (missing file, truncation, bad checksum, not a
// checkpoint, unknown format version) throws a dpar::Error naming path.
Checkpoint load_checkpoint(const std::string& path);

// The TrainingState from a checkpoint's header only (no checksum check): cheap listing.
TrainingState read_checkpoint_state(const std::string& path);

// True when path is a .safetensors file carrying checkpoint metadata (header peek only; false
// for plain weights files and for anything unreadable).
bool is_checkpoint_file(const std::string& path);

// Loads model weights from either a checkpoint (its model part, verified) or a plain weights
// file (nn::load_weights), as --pretrained and export tools accept both. strict as in
// nn::load_weights: a mismatch throws naming the file and every problem; nothing is loaded.
nn::LoadReport load_model_weights(nn::Module& model, const std::string& path, bool strict = true);

// In a distributed job: rank 0 runs load() and every rank returns rank 0's result (tensors and
// metadata travel over the default group), so only rank 0 needs to see the checkpoint files.
// If load() throws on rank 0, every rank throws a dpar::Error with the same message. In a
// world of one this is load().
std::optional<Checkpoint> load_on_rank0_and_broadcast(
    const std::function<std::optional<Checkpoint>()>& load);

// What a CheckpointManager does when its folder already holds checkpoints (rank 0 decides):
//   refuse     a dpar::Error naming the folder and its files: a second run into the same
//              folder must not write beside the first one's checkpoints, point best.ckpt at
//              its own model and leave --resume to pick the other run's newest file
//   resume     continue that run: its rotating files join the rotation (oldest first, so
//              max_num_checkpoints keeps counting them) and leftovers of interrupted writes
//              are removed, as adopt_existing() does
//   overwrite  start afresh: the earlier run's *.ckpt files are removed, with a note
//   read_only  list and load only; every save is an error (tools that inspect a folder)
enum class OnExisting { refuse, resume, overwrite, read_only };

struct CheckpointManagerOptions {
  OnExisting on_existing = OnExisting::refuse;
  int64_t max_num_checkpoints = 3;  // rotating files (model_{e}, step_{g}) kept; 0 keeps all
  int rank = 0;                     // only rank 0 writes; other ranks' saves do nothing
  // Where notes about skipped or removed files go (default: "dpar: warning: ..." on stderr).
  std::function<void(const std::string&)> warn = nullptr;
  // Hears (bytes written, bytes in all) while a checkpoint file is written, e.g. to show a
  // Progress line for large models.
  ProgressCallback progress = nullptr;
};

class CheckpointManager {
 public:
  // Rank 0 creates dir if needed and applies options.on_existing to what it holds.
  CheckpointManager(std::string dir, CheckpointManagerOptions options = {});

  const std::string& dir() const { return dir_; }
  bool writes() const { return options_.rank == 0; }
  std::string epoch_path(int64_t epoch) const;       // <dir>/model_{epoch}.ckpt
  std::string step_path(int64_t global_step) const;  // <dir>/step_{global_step}.ckpt
  std::string latest_path() const;                   // <dir>/latest.ckpt
  std::string best_path() const;                     // <dir>/best.ckpt
  // <dir>/optimizer_step_{global_step}: the shard set of the checkpoints of that step. Sets no
  // checkpoint names any more go with the rotation.
  std::string shard_set_path(int64_t global_step) const;

  // Every *.ckpt file in dir (latest and best included), sorted by name; [] if dir is absent.
  std::vector<std::string> list() const;

  // Saves model_{epoch}; points latest (and best, when is_best) at it; rotates. Returns the
  // path written, or "" on ranks other than 0.
  std::string save_epoch(const Checkpoint& checkpoint, int64_t epoch, bool is_best);
  // Saves step_{global_step}; points latest at it; rotates.
  std::string save_step(const Checkpoint& checkpoint);
  // Saves best.ckpt alone (when the epoch's file was not written).
  std::string save_best(const Checkpoint& checkpoint);

  // The newest checkpoint in dir (by global step) that loads and verifies. Corrupt or torn
  // files are skipped with a warning naming each. nullopt when dir holds no checkpoint file;
  // a dpar::Error listing the files when every one is corrupt. path_out receives its path.
  std::optional<Checkpoint> load_latest_valid(std::string* path_out = nullptr) const;

  // Adopts the rotating files already in dir with global step <= global_step (the run being
  // continued) into the rotation, oldest first, and removes leftover "*.ckpt.tmp" files and
  // "optimizer_step_*.tmp" folders of interrupted writes. Rank 0 only. OnExisting::resume does
  // this for every step; call it when the run continues from an older checkpoint than the
  // newest.
  void adopt_existing(int64_t global_step);

 private:
  void rotate(const std::string& path, int64_t global_step);
  // Removes the shard sets no checkpoint file in dir names.
  void remove_unreferenced_shard_sets();
  void point(const std::string& link, const std::string& target, const Checkpoint& checkpoint);
  void warn(const std::string& message) const;
  void check_writable() const;

  std::string dir_;
  CheckpointManagerOptions options_;
  std::vector<std::pair<int64_t, std::string>> rotating_;  // (global step, path), oldest first
};

}  // namespace dpar::io
