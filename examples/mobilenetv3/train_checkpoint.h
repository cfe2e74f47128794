#pragma once
// Checkpoint and resume support for the training program: where --resume points, whether a
// checkpoint can continue this run exactly, and the DPAR_TEST_DIE_AT_STEP test hook. (The rest
// of an interrupted epoch is replayed by the library's data::SkipSampler.)
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpar/data/sampler.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/io/checkpoint.h"
#include "dpar/optim/lr_scheduler.h"
#include "train_data.h"

namespace mobilenetv3 {

// What the run being started looks like, for the resume checks.
struct RunShape {
  std::string model_name;
  uint64_t seed = 0;
  int64_t world_size = 1;
  int64_t batch_size = 0;
  int64_t steps_per_epoch = 0;
};

// What a checkpoint records about the run beside its shape and position (TrainingState's
// extra), for the tools that read it (export_model takes the class names from it).
struct RunLabels {
  std::string class_names;  // comma-separated
  std::string lr_scheduler;
  int64_t epochs = 0;
  int64_t img_size = 0;
  std::string data_kind;  // DataSplits::kind
};

RunLabels run_labels(const DataSplits& splits, const std::string& lr_scheduler, int64_t epochs,
                     int64_t img_size);

// The TrainingState (model and optimizer aside) of a run of this shape after global_step steps,
// positioned at step step_in_epoch of epoch: what the next step starts from.
dpar::io::TrainingState run_state(const RunShape& run, const RunLabels& labels, int64_t epoch,
                                  int64_t step_in_epoch, int64_t global_step);

// When the trainers write checkpoints (--epoch-interval, --step-interval, --epochs).
struct CheckpointSchedule {
  int64_t epoch_interval = 1, step_interval = 0, epochs = 1;
  // Epoch `epoch` (from 0) ends with an epoch checkpoint: every epoch_interval-th, and the last.
  bool epoch_due(int64_t epoch) const;
  // A step checkpoint after global_step, step `iter` of steps_per_epoch in `epoch`: every
  // step_interval steps, unless the epoch's checkpoint right after covers it.
  bool step_due(int64_t epoch, int64_t iter, int64_t steps_per_epoch, int64_t global_step) const;
};

// Prints "saved checkpoint <path> (<ms since t0> ms)".
void note_saved(const std::string& path, std::chrono::steady_clock::time_point t0);

// Resolves --resume on rank 0 and shares the checkpoint with every rank:
//   ""               no resume; but a --checkpoint-dir that already holds checkpoints is an
//                    error (continue it with --resume auto, or use an empty directory)
//   "auto"/"latest"  the newest valid checkpoint in checkpoint_dir; none there: nullopt
//                    (a fresh start, so the same command line works for the first start and
//                    for dpar-launch's restarts)
//   a directory      the newest valid checkpoint in it (an error if there is none)
//   a file           that checkpoint
// Corrupt newer files are skipped with a warning naming them. The returned state's
// extra["resumed_from"] holds the path.
std::optional<dpar::io::Checkpoint> resolve_resume(const std::string& resume,
                                                   const std::string& checkpoint_dir);

// Throws dpar::FlagError when the checkpoint cannot continue this run: another seed, or a
// mid-epoch position in data of another size. Returns a note (possibly empty) when it
// continues but not bitwise: another world size or batch size (training continues at the same
// global step and the same sample of the epoch's order, see resume_position).
std::string check_resume(const dpar::io::TrainingState& state, const RunShape& run,
                         const std::string& source);

// Where a resumed run starts its first epoch: the iteration (so that the epoch still ends at
// steps_per_epoch) and, after a change of world size or batch size mid-epoch, the samples of
// the epoch's order the checkpointed job had consumed together (-1: the same shape, the rest
// of the epoch replays per rank, bitwise).
struct ResumePosition {
  int64_t first_iter = 0;
  int64_t consumed = -1;
};
ResumePosition resume_position(const dpar::io::TrainingState& state, const RunShape& run,
                               size_t dataset_size);

// After a checkpoint of another epoch length (world size or batch size) was restored: the LR
// schedule keeps its place in the epochs (the global step counts on as it was), measured in
// this run's steps.
void place_schedule(const dpar::io::TrainingState& state, const RunShape& run,
                    dpar::optim::LRScheduler& scheduler);

// The lines a resumed run prints: where it resumed, and check_resume's note when there is one.
void print_resumed(const dpar::io::TrainingState& state, const std::string& source,
                   const std::string& note);

// Puts checkpoint (read from source) back into this run after check_resume (unless test_only):
// the model; unless test_only, the LR scheduler (kept at its place in the epochs when this
// run's epochs have another length) and the optimizer in whichever form the checkpoint and the
// run have (restore_optimizer). Rank 0 prints where it resumed (and check_resume's note).
// Returns where the first epoch starts (resume_position).
ResumePosition restore_run(const dpar::io::Checkpoint& checkpoint, const std::string& source,
                           const RunShape& run, size_t dataset_size, dpar::nn::Module& model,
                           dpar::dist::DataParallel& dp,
                           const std::shared_ptr<dpar::optim::Optimizer>& opt,
                           dpar::optim::LRScheduler& scheduler, bool test_only, int rank);

// The optimizer's state in a checkpoint of a sharded run is a shard set beside the file
// (state.extra[io::kOptimizerShardsKey]); a run loads it, or an unsharded checkpoint's
// "optimizer.*" entries, into whichever layout it has (sharded or not, any world size).
// Whether this run's optimizer holds slices (--shard with more than one rank).
bool optimizer_is_sharded(const dpar::dist::DataParallel& dp);
// Writes the shard set of global_step (every rank; a set that exists already for this step is
// kept) and returns its name for the checkpoint's extra.
std::string save_optimizer_shards(const dpar::io::CheckpointManager& checkpoints,
                                  int64_t global_step, dpar::dist::DataParallel& dp,
                                  const dpar::optim::Optimizer& opt);
// Loads the optimizer state of checkpoint (read from checkpoint_path) into opt, from its shard
// set or its unsharded entries; a sharded layout takes it at the end of the first backward.
void restore_optimizer(const dpar::io::Checkpoint& checkpoint, const std::string& checkpoint_path,
                       dpar::dist::DataParallel& dp,
                       const std::shared_ptr<dpar::optim::Optimizer>& opt);

// Test hook for the restart drills: DPAR_TEST_DIE_AT_STEP=N[:R] makes rank R (default 0) kill
// itself with SIGKILL right after optimizer step N (before that step's checkpoint), in the
// first start of a job only (DPAR_RESTART_COUNT unset or 0), so dpar-launch --max_restarts
// restarts it and --resume auto continues from the last checkpoint.
class DieAtStepHook {
 public:
  explicit DieAtStepHook(int rank);
  void after_step(int64_t global_step) const;

 private:
  int64_t step_ = -1;  // -1: disarmed
};

}  // namespace mobilenetv3
