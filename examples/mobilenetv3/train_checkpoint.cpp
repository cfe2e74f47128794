#include "train_checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "dpar/core/flags.h"
#include "dpar/distributed/optimizer_shards.h"

namespace fs = std::filesystem;
using namespace dpar;

namespace mobilenetv3 {

namespace {

// The samples of the checkpoint's epoch its job had consumed, when the checkpoint records them:
// written inside an epoch that was itself resumed with another shape.
std::optional<int64_t> recorded_consumed(const io::TrainingState& s) {
  const auto recorded = s.extra.find("epoch_samples_consumed");
  if (recorded == s.extra.end() || s.step_in_epoch == 0) return std::nullopt;
  return std::stoll(recorded->second);
}

}  // namespace

RunLabels run_labels(const DataSplits& splits, const std::string& lr_scheduler, int64_t epochs,
                     int64_t img_size) {
  RunLabels labels{.class_names = "",
                   .lr_scheduler = lr_scheduler,
                   .epochs = epochs,
                   .img_size = img_size,
                   .data_kind = splits.kind};
  for (const std::string& c : splits.train->class_names()) {
    if (!labels.class_names.empty()) labels.class_names += ",";
    labels.class_names += c;
  }
  return labels;
}

io::TrainingState run_state(const RunShape& run, const RunLabels& labels, int64_t epoch,
                            int64_t step_in_epoch, int64_t global_step) {
  io::TrainingState s;
  s.model_name = run.model_name;
  s.epoch = epoch;
  s.step_in_epoch = step_in_epoch;
  s.global_step = global_step;
  s.sampler_position = step_in_epoch * run.batch_size;
  s.steps_per_epoch = run.steps_per_epoch;
  s.batch_size = run.batch_size;
  s.world_size = run.world_size;
  s.seed = run.seed;
  s.rng["data_loader"] = "seed=" + std::to_string(run.seed) + " epoch=" + std::to_string(epoch);
  s.extra = {{"class_names", labels.class_names},
             {"lr_scheduler", labels.lr_scheduler},
             {"epochs", std::to_string(labels.epochs)},
             {"img_size", std::to_string(labels.img_size)},
             {"data", labels.data_kind}};
  return s;
}

bool CheckpointSchedule::epoch_due(int64_t epoch) const {
  return (epoch + 1) % epoch_interval == 0 || epoch + 1 == epochs;
}

bool CheckpointSchedule::step_due(int64_t epoch, int64_t iter, int64_t steps_per_epoch,
                                  int64_t global_step) const {
  return step_interval > 0 && global_step % step_interval == 0 &&
         !(iter == steps_per_epoch && epoch_due(epoch));
}

void note_saved(const std::string& path, std::chrono::steady_clock::time_point t0) {
  const double ms =
      1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("saved checkpoint %s (%.0f ms)\n", path.c_str(), ms);
  std::fflush(stdout);
}

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
  if (s.step_in_epoch > 0 && s.world_size == run.world_size && s.batch_size == run.batch_size) {
    // Same job shape, another epoch length: other data, in which the position means nothing.
    throw FlagError("train: checkpoint " + source + " stopped inside epoch " +
                    std::to_string(s.epoch) + " (step " + std::to_string(s.step_in_epoch) +
                    ") of a run with " + was + "; this run has " + now +
                    ": the rest of that epoch exists only in the same training data "
                    "(--data-path, --limit-train)");
  }
  const int64_t consumed = recorded_consumed(s).value_or(s.sampler_position * s.world_size);
  return "note: the checkpoint was written with " + was + ", this run has " + now +
         "; training continues at global step " + std::to_string(s.global_step) +
         " and at sample " + std::to_string(consumed) + " of epoch " + std::to_string(s.epoch) +
         "'s order, but not bitwise as the original run would have";
}

ResumePosition resume_position(const io::TrainingState& s, const RunShape& run,
                               size_t dataset_size) {
  ResumePosition p;
  auto split_rest = [&](int64_t consumed) {
    p.consumed = consumed;
    // As EpochRemainderSampler splits the rest (drop_last: whole batches only).
    const int64_t rest = std::max<int64_t>(0, static_cast<int64_t>(dataset_size) - consumed);
    const int64_t rest_per_rank = (rest + run.world_size - 1) / run.world_size;
    p.first_iter = std::max<int64_t>(0, run.steps_per_epoch - rest_per_rank / run.batch_size);
    return p;
  };
  if (const std::optional<int64_t> consumed = recorded_consumed(s)) return split_rest(*consumed);
  const bool same_shape = s.world_size == run.world_size && s.batch_size == run.batch_size;
  if (same_shape || s.step_in_epoch == 0) {
    p.first_iter = std::min(s.step_in_epoch, run.steps_per_epoch);
    return p;
  }
  // The other job's ranks took s.sampler_position samples each, consecutive positions of the
  // epoch's order together; this job splits the rest and ends the epoch at its own length.
  return split_rest(s.sampler_position * s.world_size);
}

ResumePosition restore_run(const io::Checkpoint& ckpt, const std::string& source,
                           const RunShape& run, size_t dataset_size, nn::Module& model,
                           dist::DataParallel& dp, const std::shared_ptr<optim::Optimizer>& opt,
                           optim::LRScheduler& sched, bool test_only, int rank) {
  const io::TrainingState& st = ckpt.state;
  const std::string note = test_only ? std::string() : check_resume(st, run, source);
  // The optimizer state is a shard set beside the checkpoint (a sharded run's), or goes into
  // this run's slices: either way the library re-cuts it (any world size).
  const bool shards_involved =
      st.extra.count(io::kOptimizerShardsKey) > 0 || optimizer_is_sharded(dp);
  io::restore_checkpoint(ckpt, model, test_only || shards_involved ? nullptr : opt.get(),
                         test_only ? nullptr : &sched, source);
  if (!test_only && shards_involved) restore_optimizer(ckpt, source, dp, opt);
  if (!test_only) place_schedule(st, run, sched);
  if (rank == 0) print_resumed(st, source, note);
  return resume_position(st, run, dataset_size);
}

void place_schedule(const io::TrainingState& st, const RunShape& run, optim::LRScheduler& sched) {
  if (st.steps_per_epoch <= 0 || st.steps_per_epoch == run.steps_per_epoch) return;
  const double progress =
      static_cast<double>(sched.last_step()) / static_cast<double>(st.steps_per_epoch);
  sched.set_last_step(
      static_cast<int64_t>(std::llround(progress * static_cast<double>(run.steps_per_epoch))));
}

void print_resumed(const io::TrainingState& st, const std::string& source,
                   const std::string& note) {
  std::printf(
      "resumed from %s: epoch %lld, step %lld of %lld, global step %lld (written by dpar %s, "
      "commit %s)\n",
      source.c_str(), static_cast<long long>(st.epoch), static_cast<long long>(st.step_in_epoch),
      static_cast<long long>(st.steps_per_epoch), static_cast<long long>(st.global_step),
      st.dpar_version.c_str(), st.git_commit.c_str());
  if (!note.empty()) std::printf("%s\n", note.c_str());
  std::fflush(stdout);
}

bool optimizer_is_sharded(const dist::DataParallel& dp) {
  return dp.shard() != dist::ShardMode::none && dp.group() && dp.group()->size() > 1;
}

std::string save_optimizer_shards(const io::CheckpointManager& checkpoints, int64_t global_step,
                                  dist::DataParallel& dp, const optim::Optimizer& opt) {
  const std::string path = checkpoints.shard_set_path(global_step);
  // The checkpoints of one step (a step file, then best.ckpt) share one set; rank 0 decides.
  Tensor exists = Tensor::full({1}, fs::exists(path + "/index.json") ? 1.0 : 0.0);
  dp.group()->broadcast({exists}, 0, /*async_op=*/false);
  if (exists.item() == 0.0) dp.save_optimizer_state(opt, path);
  return fs::path(path).filename().string();
}

void restore_optimizer(const io::Checkpoint& ckpt, const std::string& checkpoint_path,
                       dist::DataParallel& dp, const std::shared_ptr<optim::Optimizer>& opt) {
  const auto kind = ckpt.state.extra.find("optimizer");
  if (kind != ckpt.state.extra.end() && kind->second != opt->name()) {
    throw FlagError("train: checkpoint " + checkpoint_path + " holds " + kind->second +
                    " optimizer state, but this run uses " + opt->name() + " (--opt)");
  }
  const auto shards = ckpt.state.extra.find(io::kOptimizerShardsKey);
  if (shards != ckpt.state.extra.end()) {
    const std::string dir = (fs::path(checkpoint_path).parent_path() / shards->second).string();
    const std::string name = opt->name();
    dp.load_optimizer_state(opt, [dir, name](const dist::OptimizerLayout& layout) {
      return dist::read_optimizer_shards(dir, layout, name);
    });
    return;
  }
  // An unsharded checkpoint: its entries are over the model's parameters, whole.
  const dist::OptimizerLayout whole = dist::whole_parameter_layout(dp.named_parameters());
  const optim::StateDict state = ckpt.optimizer;
  dp.load_optimizer_state(opt, [whole, state](const dist::OptimizerLayout& layout) {
    return dist::slice_optimizer_state(state, whole, layout);
  });
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
