#include "train_elastic.h"

#include <bit>
#include <chrono>
#include <cstdio>
#include <optional>

#include "dpar/core/random.h"
#include "dpar/data/dataloader.h"
#include "dpar/distributed/elastic.h"
#include "dpar/dpar.h"
#include "dpar/io/checkpoint.h"
#include "dpar/optim/clip_grad.h"
#include "model/mobilenet_v3.h"
#include "train_checkpoint.h"
#include "train_data.h"
#include "train_log.h"
#include "train_output.h"

namespace mobilenetv3 {

using namespace dpar;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Doubles travel and are kept as the bits of an i64 tensor (exact; tensors have no f64).
Tensor double_bits(const std::vector<double>& values) {
  Tensor t = Tensor::zeros({static_cast<int64_t>(values.size())}, DType::i64);
  for (size_t i = 0; i < values.size(); ++i)
    t.data<int64_t>()[i] = std::bit_cast<int64_t>(values[i]);
  return t;
}
double double_at(const Tensor& bits, int64_t i) {
  return std::bit_cast<double>(bits.data<int64_t>()[i]);
}

// Rank 0's evaluation figures, on every rank of the round.
Metrics share_metrics(dist::Group& group, const Metrics& m) {
  Tensor figures = double_bits({m.loss, m.top1, m.top5, static_cast<double>(m.samples)});
  group.broadcast({figures}, 0, /*async_op=*/false);
  return Metrics{double_at(figures, 0), double_at(figures, 1), double_at(figures, 2),
                 static_cast<int64_t>(double_at(figures, 3))};
}

}  // namespace

int train_elastic(const ElasticTrainSettings& s) {
  const DataSplits splits = load_data(s.data_path, s.img_size, s.limit_train, s.limit_val);
  const int64_t classes =
      s.num_classes > 0 ? s.num_classes : static_cast<int64_t>(splits.train->class_names().size());
  auto model = models::mobilenet_v3(s.model_name, classes);
  if (!s.pretrained.empty()) {
    // Every member loads it; a member that joins a running job then receives the live state.
    io::load_model_weights(*model, s.pretrained, /*strict=*/true);
    std::printf("loaded pretrained weights from %s\n", s.pretrained.c_str());
  }
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
  // the position in the epoch is two counters. epoch_offset: where the epoch's order stands
  // besides step_in_epoch x global batch (nonzero only in an epoch resumed from a checkpoint
  // of another shape, whose steps fell elsewhere in the order).
  int64_t epoch = 0, step_in_epoch = 0, global_step = 0, epoch_offset = 0;
  BestEpoch best;
  dist::ElasticState state;
  // The planned job's shape: what its checkpoints record, whatever the world of the moment.
  const RunShape run{s.model_name, s.seed, planned_world, s.batch_size, steps_per_epoch};
  const RunLabels labels = run_labels(splits, s.lr_scheduler, s.epochs, s.img_size);
  if (std::optional<io::Checkpoint> resumed = resolve_resume(s.resume, s.checkpoint_dir)) {
    const io::TrainingState& st = resumed->state;
    const auto from = st.extra.find("resumed_from");
    const std::string source = from != st.extra.end() ? from->second : s.resume;
    const std::string note = check_resume(st, run, source);
    io::restore_checkpoint(*resumed, *model, opt.get(), sched.get(), source);
    place_schedule(st, run, *sched);
    const ResumePosition position = resume_position(st, run, static_cast<size_t>(train_size));
    epoch = st.epoch;
    step_in_epoch = position.first_iter;
    global_step = st.global_step;
    if (position.consumed >= 0) epoch_offset = position.consumed - step_in_epoch * global_batch;
    best = {st.best_top1, st.best_epoch};
    // The commits an uninterrupted run would have made by now, less run()'s first: a member
    // that joins the running job with an older checkpoint (or none) gets the live state.
    state.set_version(global_step + epoch);
    print_resumed(st, source, note);
  }
  state.add_module("model", *model);
  state.add_optimizer("optimizer", *opt);
  state.add_scheduler("lr_scheduler", *sched);
  state.add_generator("dropout", default_generator());
  state.add_counter("epoch", epoch);
  state.add_counter("step_in_epoch", step_in_epoch);
  state.add_counter("global_step", global_step);
  state.add_counter("epoch_offset", epoch_offset);
  state.add_counter("best_epoch", best.epoch);
  state.add(
      "best_top1",
      [&] {
        return nn::NamedTensors{{"value", double_bits({best.top1})}};
      },
      [&](const nn::NamedTensors& t) { best.top1 = double_at(t.at(0).second, 0); });

  data::DataLoader val_loader(
      splits.val, std::make_shared<data::DistributedSampler>(splits.val->size(), 0, 1, false),
      {.batch_size = static_cast<size_t>(s.batch_size),
       .num_workers = s.workers,
       .prefetch_batches = 4,
       .drop_last = false,
       .seed = s.seed});
  Metrics last_eval;
  std::optional<DieAtStepHook> die_hook;  // DPAR_TEST_DIE_AT_STEP, for round 0's ranks
  // Held while this member is the round's rank 0, the one that logs and writes: its log lines
  // and TensorBoard event file (each rank 0 its own file in the folder; TensorBoard merges a
  // folder's files into one run).
  std::unique_ptr<TrainLog> log;
  // Held while this member is the round's rank 0, the one that writes. Opened anew when it
  // becomes rank 0 (adopting what the previous writer left); never opened by the others, since
  // opening tidies the folder (leftovers of interrupted writes) under a writer's feet.
  std::unique_ptr<io::CheckpointManager> checkpoints;
  auto checkpoint_at = [&](int64_t epoch_pos, int64_t step_pos) {
    io::TrainingState st = run_state(run, labels, epoch_pos, step_pos, global_step);
    st.best_top1 = best.top1;
    st.best_epoch = best.epoch;
    if (epoch_offset != 0 && step_pos > 0) {
      st.extra["epoch_samples_consumed"] = std::to_string(epoch_offset + step_pos * global_batch);
    }
    return io::capture_checkpoint(*model, opt.get(), sched.get(), std::move(st));
  };
  const CheckpointSchedule saving{s.epoch_interval, s.step_interval, s.epochs};
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
    if (rank != 0) {
      checkpoints.reset();
      log.reset();
    } else {
      if (!s.checkpoint_dir.empty() && !checkpoints) {
        checkpoints = std::make_unique<io::CheckpointManager>(
            s.checkpoint_dir,
            io::CheckpointManagerOptions{.on_existing = io::OnExisting::resume,
                                         .max_num_checkpoints = s.max_checkpoints});
      }
      // Without the default group's gather: this member's own images/s (rank0/ips).
      if (!log) log = std::make_unique<TrainLog>(s.tensorboard, 0, /*gather_ranks=*/false);
    }
    dist::DataParallelOptions dp_options = s.dp_options;
    dp_options.group = job.group_ptr();
    dist::DataParallel dp(model, dp_options);
    while (epoch < s.epochs) {
      auto order = std::make_shared<data::DistributedSampler>(splits.train->size(), rank, world,
                                                              /*shuffle=*/true, s.seed);
      data::DataLoader loader(
          splits.train,
          std::make_shared<data::EpochRemainderSampler>(
              order, epoch, static_cast<size_t>(epoch_offset + step_in_epoch * global_batch)),
          {.batch_size = static_cast<size_t>(plan.micro_batch),
           .num_workers = s.workers,
           .prefetch_batches = 4,
           .drop_last = true,
           .seed = s.seed});
      Metrics window;
      double reader_s = 0, batch_s = 0;
      auto t_prev = Clock::now();
      int64_t micro = 0;
      for (data::Batch& batch : loader.epoch(epoch)) {
        if (step_in_epoch == steps_per_epoch) break;
        reader_s += seconds_since(t_prev);
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
        batch_s += seconds_since(t_prev);
        t_prev = Clock::now();
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
        if (log && (step_in_epoch % s.print_freq == 0 || step_in_epoch == steps_per_epoch)) {
          // The fixed-world trainer's line (PaddlePaddle's format) and TensorBoard scalars.
          log->step({.epoch = epoch,
                     .iter = step_in_epoch,
                     .global_step = global_step,
                     .window = window,
                     .lr = lr,
                     .reader_seconds = reader_s,
                     .batch_seconds = batch_s,
                     .batch_size = plan.micro_batch * plan.accumulation,
                     .memory = dp.memory_stats()});
          window = Metrics();
          reader_s = batch_s = 0;
        }
        if (checkpoints && saving.step_due(epoch, step_in_epoch, steps_per_epoch, global_step)) {
          const auto t0 = Clock::now();
          note_saved(checkpoints->save_step(checkpoint_at(epoch, step_in_epoch)), t0);
        }
        job.commit();
        last_commit = Clock::now();
      }
      DPAR_CHECK(step_in_epoch == steps_per_epoch, "train --elastic: epoch ", epoch,
                 " ended after ", step_in_epoch, " of ", steps_per_epoch, " steps");
      // The round's rank 0 evaluates the whole validation set alone (on the module: the
      // DataParallel's buffer broadcast would be a collective) and hands the figures on, so
      // that whichever member is rank 0 later knows the best epoch.
      if (log) {
        last_eval = evaluate(*model, val_loader, Device::cpu(), /*show_progress=*/false);
        log->eval(epoch, global_step, last_eval, seconds_since(train_start));
      }
      last_eval = share_metrics(group, last_eval);
      const bool is_best = best.update(last_eval, epoch);
      if (checkpoints && (saving.epoch_due(epoch) || is_best)) {
        const auto t0 = Clock::now();
        const io::Checkpoint checkpoint = checkpoint_at(epoch + 1, 0);
        note_saved(saving.epoch_due(epoch) ? checkpoints->save_epoch(checkpoint, epoch, is_best)
                                           : checkpoints->save_best(checkpoint),
                   t0);
      }
      ++epoch;
      step_in_epoch = 0;
      epoch_offset = 0;
      job.commit();
      last_commit = Clock::now();
    }
  });
  if (log) log->close();
  const double elapsed = seconds_since(train_start);
  std::printf("elastic: finished %lld steps of %lld epochs as rank %d of %d after %zu rounds\n",
              static_cast<long long>(global_step), static_cast<long long>(s.epochs), job.rank(),
              job.world_size(), job.history().size());
  if (job.rank() == 0) {
    // This member joined after the last evaluation (or was not rank 0 then): its own figures.
    if (last_eval.samples == 0) last_eval = evaluate(*model, val_loader, Device::cpu(), false);
    std::printf("final: top1 %.4f, top5 %.4f on %zu validation images after %lld epochs (%.1f s)\n",
                last_eval.acc1(), last_eval.acc5(), splits.val->size(),
                static_cast<long long>(s.epochs), elapsed);
    write_outputs(*model, splits,
                  {.dir = s.output_dir,
                   .model_name = s.model_name,
                   .img_size = s.img_size,
                   .num_classes = classes,
                   .export_inference = s.export_inference});
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace mobilenetv3
