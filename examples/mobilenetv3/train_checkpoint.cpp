#include "train_checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "dpar/core/flags.h"

namespace fs = std::filesystem;
using namespace dpar;

namespace mobilenetv3 {

std::optional<io::Checkpoint> resolve_resume(const std::string& resume,
                                             const std::string& checkpoint_dir) {
  return io::load_on_rank0_and_broadcast([&]() -> std::optional<io::Checkpoint> {
    std::optional<io::Checkpoint> ckpt;
    std::string path;
    if (resume.empty()) {
      if (!checkpoint_dir.empty()) {
        const std::vector<std::string> existing =
            io::CheckpointManager(checkpoint_dir, {.on_existing = io::OnExisting::read_only})
                .list();
        DPAR_CHECK(existing.empty(), "--checkpoint-dir ", checkpoint_dir, " already holds ",
                   existing.size(), " checkpoint(s) (",
                   fs::path(existing.back()).filename().string(),
                   ", ...) of an earlier run: pass --resume auto to continue it, or use an empty "
                   "directory");
      }
      return std::nullopt;
    }
    if (resume == "auto" || resume == "latest") {
      ckpt = io::CheckpointManager(checkpoint_dir, {.on_existing = io::OnExisting::read_only})
                 .load_latest_valid(&path);
      if (!ckpt) {
        std::printf("--resume %s: no checkpoint in %s yet; starting from scratch\n", resume.c_str(),
                    checkpoint_dir.c_str());
        std::fflush(stdout);
        return std::nullopt;
      }
    } else if (fs::is_directory(resume)) {
      ckpt = io::CheckpointManager(resume, {.on_existing = io::OnExisting::read_only})
                 .load_latest_valid(&path);
      DPAR_CHECK(ckpt.has_value(), "--resume ", resume, ": the directory holds no checkpoint");
    } else {
      DPAR_CHECK(fs::exists(resume), "--resume ", resume, ": no such file or directory");
      ckpt = io::load_checkpoint(resume);
      path = resume;
    }
    ckpt->state.extra["resumed_from"] = path;
    return ckpt;
  });
}

std::string check_resume(const io::TrainingState& s, const RunShape& run,
                         const std::string& source) {
  if (s.seed != run.seed) {
    throw FlagError("train: checkpoint " + source + " was trained with --seed " +
                    std::to_string(s.seed) + ", this run has --seed " + std::to_string(run.seed) +
                    ": resume with --seed " + std::to_string(s.seed) +
                    " (the seed fixes the data order and augmentation)");
  }
  const bool same_shape = s.world_size == run.world_size && s.batch_size == run.batch_size &&
                          s.steps_per_epoch == run.steps_per_epoch;
  if (same_shape) return {};
  const std::string was = "world size " + std::to_string(s.world_size) + " x batch " +
                          std::to_string(s.batch_size) + ", " + std::to_string(s.steps_per_epoch) +
                          " steps/epoch";
  const std::string now = "world size " + std::to_string(run.world_size) + " x batch " +
                          std::to_string(run.batch_size) + ", " +
                          std::to_string(run.steps_per_epoch) + " steps/epoch";
  if (s.step_in_epoch > 0) {
    throw FlagError("train: checkpoint " + source + " stopped inside epoch " +
                    std::to_string(s.epoch) + " (step " + std::to_string(s.step_in_epoch) +
                    ") of a run with " + was + "; this run has " + now +
                    ": the rest of that epoch can only be replayed with the same world size, "
                    "batch size and data");
  }
  return "note: the checkpoint was written with " + was + ", this run has " + now +
         "; training continues from epoch " + std::to_string(s.epoch) +
         " but not bitwise as the original run would have";
}

DieAtStepHook::DieAtStepHook(int rank) {
  const char* spec = std::getenv("DPAR_TEST_DIE_AT_STEP");
  if (!spec || !*spec) return;
  const char* restarts = std::getenv("DPAR_RESTART_COUNT");
  if (restarts && std::string(restarts) != "0") return;
  char* end = nullptr;
  const long long step = std::strtoll(spec, &end, 10);
  long long die_rank = 0;
  if (*end == ':') die_rank = std::strtoll(end + 1, &end, 10);
  DPAR_CHECK(*end == '\0' && step > 0 && die_rank >= 0, "DPAR_TEST_DIE_AT_STEP=", spec,
             ": expected N or N:RANK (N >= 1)");
  if (die_rank == rank) step_ = step;
}

void DieAtStepHook::after_step(int64_t global_step) const {
  if (global_step != step_) return;
  std::printf("DPAR_TEST_DIE_AT_STEP: killing this process (SIGKILL) after global step %lld\n",
              static_cast<long long>(global_step));
  std::fflush(stdout);
  ::kill(::getpid(), SIGKILL);
}

}  // namespace mobilenetv3
