#pragma once
// Checkpoint and resume support for the training program: where --resume points, whether a
// checkpoint can continue this run exactly, and the DPAR_TEST_DIE_AT_STEP test hook. (The rest
// of an interrupted epoch is replayed by the library's data::SkipSampler.)
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpar/data/sampler.h"
#include "dpar/io/checkpoint.h"

namespace mobilenetv3 {

// What the run being started looks like, for the resume checks.
struct RunShape {
  std::string model_name;
  uint64_t seed = 0;
  int64_t world_size = 1;
  int64_t batch_size = 0;
  int64_t steps_per_epoch = 0;
};

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

// Throws dpar::FlagError when the checkpoint cannot continue this run exactly: another seed,
// or a mid-epoch position with another world size, batch size or epoch length. Returns a note
// (possibly empty) when it can continue but not bitwise (an epoch boundary with another
// world size or batch size).
std::string check_resume(const dpar::io::TrainingState& state, const RunShape& run,
                         const std::string& source);

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
