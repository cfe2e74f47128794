#include "train_elastic.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "dpar/core/random.h"
#include "dpar/data/dataloader.h"
#include "dpar/distributed/elastic.h"
#include "dpar/dpar.h"
#include "dpar/nn/weights.h"
#include "dpar/optim/clip_grad.h"
#include "model/mobilenet_v3.h"
#include "train_checkpoint.h"
#include "train_data.h"
#include "train_log.h"

namespace mobilenetv3 {

using namespace dpar;
using Clock = std::chrono::steady_clock;

int train_elastic(const ElasticTrainSettings& s) {
  const DataSplits splits = load_data(s.data_path, s.img_size, s.limit_train, s.limit_val);
  const int64_t classes =
      s.num_classes > 0 ? s.num_classes : static_cast<int64_t>(splits.train->class_names().size());
  auto model = models::mobilenet_v3(s.model_name, classes);
  model->train();
  std::shared_ptr<optim::Optimizer> opt = s.make_optimizer(model->parameters());

  const dist::ElasticOptions options = dist::ElasticOptions::from_env();
  const int planned_world = options.max_members;
  const int64_t global_batch = s.batch_size * planned_world;
  const auto train_size = static_cast<int64_t>(splits.train->size());
  const int64_t steps_per_epoch = train_size / global_batch;
  if (steps_per_epoch == 0) {
    throw FlagError("train --elastic: the global batch (--batch-size " +
                    std::to_string(s.batch_size) + " x " + std::to_string(planned_world) +
                    " members) is larger than the " + std::to_string(train_size) +
                    " training images");
  }
  std::unique_ptr<optim::LRScheduler> sched = s.make_scheduler(*opt, steps_per_epoch);

  // Everything the next step depends on; the data order is a function of (seed, epoch), so
  // the position in the epoch is two counters.
  int64_t epoch = 0, step_in_epoch = 0, global_step = 0;
  dist::ElasticState state;
  state.add_module("model", *model);
  state.add_optimizer("optimizer", *opt);
  state.add_scheduler("lr_scheduler", *sched);
  state.add_generator("dropout", default_generator());
  state.add_counter("epoch", epoch);
  state.add_counter("step_in_epoch", step_in_epoch);
  state.add_counter("global_step", global_step);

  data::DataLoader val_loader(
      splits.val, std::make_shared<data::DistributedSampler>(splits.val->size(), 0, 1, false),
      {.batch_size = static_cast<size_t>(s.batch_size),
       .num_workers = s.workers,
       .prefetch_batches = 4,
       .drop_last = false,
       .seed = s.seed});
  Metrics last_eval;
  std::optional<DieAtStepHook> die_hook;  // DPAR_TEST_DIE_AT_STEP, for round 0's ranks
  dist::ElasticJob job(options);
  auto last_commit = Clock::now();
  const auto train_start = Clock::now();
  job.run(state, [&](dist::Group& group) {
    const int rank = group.rank(), world = group.size();
    if (!die_hook) die_hook.emplace(rank);
    const dist::StepPlan plan =
        dist::plan_step(dist::BatchPolicy::KeepGlobalBatch, s.batch_size, planned_world, world);
    std::printf(
        "elastic: round %lld: rank %d of %d at epoch %lld, step %lld (%.1f s after the last "
        "commit); %lld x %lld images per rank and step\n",
        static_cast<long long>(job.round()), rank, world, static_cast<long long>(epoch),
        static_cast<long long>(global_step),
        std::chrono::duration<double>(Clock::now() - last_commit).count(),
        static_cast<long long>(plan.accumulation), static_cast<long long>(plan.micro_batch));
    std::fflush(stdout);
    dist::DataParallelOptions dp_options = s.dp_options;
    dp_options.group = job.group_ptr();
    dist::DataParallel dp(model, dp_options);
    while (epoch < s.epochs) {
      auto order = std::make_shared<data::DistributedSampler>(splits.train->size(), rank, world,
                                                              /*shuffle=*/true, s.seed);
      data::DataLoader loader(splits.train,
                              std::make_shared<data::EpochRemainderSampler>(
                                  order, epoch, static_cast<size_t>(step_in_epoch * global_batch)),
                              {.batch_size = static_cast<size_t>(plan.micro_batch),
                               .num_workers = s.workers,
                               .prefetch_batches = 4,
                               .drop_last = true,
                               .seed = s.seed});
      Metrics window;
      int64_t micro = 0;
      for (data::Batch& batch : loader.epoch(epoch)) {
        if (step_in_epoch == steps_per_epoch) break;
        if (micro == 0) opt->zero_grad();
        const bool last_micro = micro + 1 == plan.accumulation;
        Tensor logits = dp.forward(batch.images);
        Tensor loss = cross_entropy(logits, batch.labels, s.label_smoothing);
        // The mean over this rank's whole step; only its last micro-batch all-reduces.
        const Tensor scaled = loss * (1.0 / static_cast<double>(plan.accumulation));
        if (last_micro) {
          scaled.backward();
        } else {
          auto no_sync = dp.no_sync();
          scaled.backward();
        }
        {
          NoGradGuard no_grad;
          window.add(loss.item(), logits.detach(), batch.labels);
        }
        if (!last_micro) {
          ++micro;
          continue;
        }
        micro = 0;
        if (s.clip_grad_norm > 0) optim::clip_grad_norm(*opt, s.clip_grad_norm);
        opt->step();
        const double lr = opt->lr();
        sched->step();
        ++step_in_epoch;
        ++global_step;
        die_hook->after_step(global_step);
        if (rank == 0 && (step_in_epoch % s.print_freq == 0 || step_in_epoch == steps_per_epoch)) {
          // The fixed-world trainer's line (PaddlePaddle's format), with the world size.
          std::printf(
              "[Epoch %lld, iter: %lld] top1: %.5f, top5: %.5f, lr: %.6f, loss: %.5f, world "
              "size: %d\n",
              static_cast<long long>(epoch), static_cast<long long>(step_in_epoch), window.acc1(),
              window.acc5(), lr, window.avg_loss(), world);
          std::fflush(stdout);
          window = Metrics();
        }
        job.commit();
        last_commit = Clock::now();
      }
      DPAR_CHECK(step_in_epoch == steps_per_epoch, "train --elastic: epoch ", epoch,
                 " ended after ", step_in_epoch, " of ", steps_per_epoch, " steps");
      // The round's rank 0 evaluates the whole validation set alone (there is no group beyond
      // the round's); the others wait for it in the next step's all-reduce.
      if (rank == 0) {
        last_eval = evaluate(*model, val_loader, Device::cpu(), /*show_progress=*/false);
        std::printf("[Eval][Epoch %lld][Avg] loss: %.5f, top1: %.5f, top5: %.5f\n",
                    static_cast<long long>(epoch), last_eval.avg_loss(), last_eval.acc1(),
                    last_eval.acc5());
        std::fflush(stdout);
      }
      ++epoch;
      step_in_epoch = 0;
      job.commit();
      last_commit = Clock::now();
    }
  });
  const double elapsed = std::chrono::duration<double>(Clock::now() - train_start).count();
  std::printf("elastic: finished %lld steps of %lld epochs as rank %d of %d after %zu rounds\n",
              static_cast<long long>(global_step), static_cast<long long>(s.epochs), job.rank(),
              job.world_size(), job.history().size());
  if (job.rank() == 0) {
    // This member joined after the last evaluation (or was not rank 0 then): its own figures.
    if (last_eval.samples == 0) last_eval = evaluate(*model, val_loader, Device::cpu(), false);
    std::printf("final: top1 %.4f, top5 %.4f on %zu validation images after %lld epochs (%.1f s)\n",
                last_eval.acc1(), last_eval.acc5(), splits.val->size(),
                static_cast<long long>(s.epochs), elapsed);
    if (!s.output_dir.empty()) {
      std::filesystem::create_directories(s.output_dir);
      const std::string path = s.output_dir + "/" + s.model_name + ".safetensors";
      nn::save_weights(*model, path);
      std::printf("saved weights to %s\n", path.c_str());
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace mobilenetv3
