// Trains MobileNetV3 (small or large) on Fashion-MNIST or an ImageNet-style image folder, in
// one process or as one rank of a job started by dpar-launch (init_parallel_env +
// DataParallel + DistributedSampler; the same binary either way). Log lines follow
// PaddlePaddle's format so existing log tooling keeps working.
//   train --model mobilenet_v3_small --data-path /usr/share/datasets/fashion-mnist
//         --img-size 32 --epochs 3 --batch-size 64 --lr 0.1
// Checkpoints (--checkpoint-dir, rank 0 writes) hold everything the next step depends on, so
// --resume continues bitwise as if never interrupted; see train_checkpoint.h (also for the
// DPAR_TEST_DIE_AT_STEP test hook).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "dpar/core/progress.h"
#include "dpar/core/sysinfo.h"
#include "dpar/data/dataloader.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"
#include "dpar/io/checkpoint.h"
#include "dpar/optim/clip_grad.h"
#include "dpar/optim/lr_scheduler.h"
#include "model/mobilenet_v3.h"
#include "train_checkpoint.h"
#include "train_data.h"
#include "train_elastic.h"
#include "train_log.h"
#include "train_optim.h"
#include "train_output.h"
#include "train_ps.h"

using namespace dpar;
using mobilenetv3::evaluate;
using mobilenetv3::Metrics;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("train", [&] {
    Flags flags("train", "Trains MobileNetV3 on Fashion-MNIST or an ImageNet-style folder.");
    auto& model_name =
        flags.add_string("model", "mobilenet_v3_small", "mobilenet_v3_small or mobilenet_v3_large");
    auto& data_path =
        flags.add_string("data-path", data::FashionMnist::kDebianDir,
                         "Fashion-MNIST idx folder, or a folder with train/ and val/");
    auto& epochs = flags.add_int("epochs", 3, "passes over the training data");
    auto& batch_size = flags.add_int("batch-size", 64, "images per step (per rank)");
    auto& opt_name = flags.add_string("opt", "sgd", "optimizer: sgd, rmsprop or adamw");
    auto& lr = flags.add_double("lr", 0.1, "peak learning rate");
    auto& momentum = flags.add_double("momentum", 0.9, "momentum (sgd, rmsprop)");
    auto& weight_decay = flags.add_double("weight-decay", 4e-5, "weight decay");
    auto& scheduler = flags.add_string("lr-scheduler", "cosine", "cosine (with warmup) or step");
    auto& warmup_epochs =
        flags.add_double("warmup-epochs", 0.3, "linear warmup length in epochs (cosine)");
    auto& step_epochs = flags.add_int("lr-step-epochs", 1, "epochs per decay (step scheduler)");
    auto& lr_gamma = flags.add_double("lr-gamma", 0.1, "decay factor (step scheduler)");
    auto& label_smoothing =
        flags.add_double("label-smoothing", 0.0, "cross-entropy label smoothing");
    auto& grad_comm_dtype = flags.add_string(
        "grad-comm-dtype", "f32",
        "dtype gradients travel in between ranks: f32 (exact), bf16 or f16 (half the bytes)");
    auto& broadcast_buffers = flags.add_bool(
        "broadcast-buffers", true,
        "rank 0's BN running statistics go to every rank before each training forward (false: "
        "each rank keeps the statistics of its own batches)");
    auto& shard = flags.add_string(
        "shard", "none",
        "what ranks split (ZeRO): none, optimizer (optimizer state and averaged gradients: each "
        "rank updates its slice) or gradients (also the gradient buckets, released after their "
        "reduce-scatter)");
    auto& clip_grad_norm =
        flags.add_double("clip-grad-norm", 0, "clip gradients to this global L2 norm (0: off)");
    auto& img_size = flags.add_int("img-size", 32, "input image side");
    auto& num_classes = flags.add_int("num-classes", 0, "classes (0: from the data)");
    auto& seed = flags.add_int("seed", 0, "seed for initialisation, shuffling and augmentation");
    auto& threads =
        flags.add_int("threads", 0, "intra-op threads (0: OMP_NUM_THREADS or all cores)");
    auto& workers = flags.add_int("workers", 1, "data loader threads");
    auto& pretrained = flags.add_string(
        "pretrained", "",
        "weights to start from: a .safetensors state dict or a checkpoint (its model part)");
    auto& output_dir = flags.add_string("output-dir", "", "where to write the trained weights");
    auto& export_inference = flags.add_bool(
        "export", true,
        "with --output-dir, rank 0 exports the ONNX inference model to <output-dir>/inference");
    auto& print_freq = flags.add_int("print-freq", 50, "log every N iterations");
    auto& limit_train =
        flags.add_int("limit-train", 0, "use only the first N training images (0: all)");
    auto& limit_val =
        flags.add_int("limit-val", 0, "use only the first N validation images (0: all)");
    auto& loss_log =
        flags.add_string("loss-log", "", "write every step's loss (exact hex) to this file");
    auto& tensorboard = flags.add_string(
        "tensorboard", "",
        "rank 0 writes TensorBoard event files (scalars per logged step and epoch) into this "
        "folder; --tensorboard alone: output/tb");
    flags.set_implicit_value("tensorboard", "output/tb");
    auto& checkpoint_dir = flags.add_string("checkpoint-dir", "",
                                            "write checkpoints here (rank 0): model_{epoch}.ckpt, "
                                            "step_{global step}.ckpt, latest.ckpt, best.ckpt");
    auto& max_checkpoints = flags.add_int("max-num-checkpoints", 3,
                                          "keep the newest N model_/step_ checkpoints (0: all)");
    auto& epoch_interval =
        flags.add_int("epoch-interval", 1, "checkpoint every N epochs (and the last)");
    auto& step_interval =
        flags.add_int("step-interval", 0, "also checkpoint every N global steps (0: off)");
    auto& resume = flags.add_string("resume", "",
                                    "continue from a checkpoint file, a checkpoint folder, or "
                                    "'auto'/'latest' (newest valid one in --checkpoint-dir; none: "
                                    "start fresh)");
    auto& test_only =
        flags.add_bool("test-only", false, "only evaluate the --pretrained or --resume weights");
    auto& device = flags.add_string("device", "cpu",
                                    "cpu, gpu (this process's GPU: the launcher's, else 0) or "
                                    "gpu:<index>");
    auto& dist_backend =
        flags.add_string("dist-backend", "",
                         "collectives for GPU tensors: nccl, or gloo through host memory (default: "
                         "$DPAR_DIST_BACKEND, else nccl)");
    auto& amp = flags.add_string(
        "amp", "",
        "mixed precision: fp16 (GPU, with dynamic loss scaling) or bf16 (GPU, or a CPU with "
        "AVX512-BF16); convolutions and linear layers compute in that dtype and the activations "
        "between them stay in it; weights, BN statistics and the loss stay f32");
    auto& elastic = flags.add_bool(
        "elastic", false,
        "a member of an elastic job (dpar-launch --nnodes=MIN:MAX): survives members that die "
        "or join, keeping the global batch of DPAR_ELASTIC_MAX members");
    mobilenetv3::PsFlags ps_flags(flags);
    flags.parse(argc, argv);

    if (epochs < 1) throw FlagError("train: --epochs must be >= 1");
    if (batch_size < 1) throw FlagError("train: --batch-size must be >= 1");
    if (img_size < 16) throw FlagError("train: --img-size must be >= 16");
    if (print_freq < 1) throw FlagError("train: --print-freq must be >= 1");
    if (max_checkpoints < 0) throw FlagError("train: --max-num-checkpoints must be >= 0");
    if (epoch_interval < 1) throw FlagError("train: --epoch-interval must be >= 1");
    if (step_interval < 0) throw FlagError("train: --step-interval must be >= 0");
    if ((resume == "auto" || resume == "latest") && checkpoint_dir.empty()) {
      throw FlagError("train: --resume " + resume + " needs --checkpoint-dir");
    }
    if (test_only && pretrained.empty() && resume.empty()) {
      throw FlagError("train: --test-only needs --pretrained or --resume");
    }
    if (!pretrained.empty() && !resume.empty()) {
      throw FlagError(
          "train: --pretrained and --resume exclude each other (a checkpoint holds the weights)");
    }
    // "gpu"/"cuda" without an index means this process's GPU: the launcher's DPAR_DEVICE
    // (gpu:<local rank>), else GPU 0. The device is checked once the environment is read.
    const bool on_gpu = device == "gpu" || device == "cuda" || device.rfind("gpu:", 0) == 0 ||
                        device.rfind("cuda:", 0) == 0;
    if (!amp.empty() && amp != "fp16" && amp != "bf16") {
      throw FlagError("train: --amp=" + amp + ": expected fp16 or bf16");
    }
    // Refused rather than silently training in fp32 (or in emulated bf16, slower than fp32): a
    // user who asked for AMP would otherwise compare fp32 speed and memory against their
    // expectations of AMP.
    if (amp == "fp16" && !on_gpu) {
      throw FlagError(
          "train: --amp=fp16: fp16 mixed precision runs on a GPU (--device gpu); on "
          "the CPU use --amp bf16");
    }
    if (amp == "bf16" && !on_gpu && amp::cpu_bf16_support() != amp::CpuBf16::native) {
      throw FlagError(
          "train: --amp=bf16 on the CPU needs AVX512-BF16 (oneDNN's bf16 kernels), which oneDNN "
          "does not find on this CPU (" +
          sysinfo::cpu_model() + "); train in fp32");
    }
    if (!on_gpu && device != "cpu") {
      throw FlagError("train: --device=" + device + ": expected cpu, gpu or gpu:<index>");
    }
    // Validate every choice before loading data, so usage errors come back at once.
    if (opt_name != "sgd" && opt_name != "momentum" && opt_name != "rmsprop" &&
        opt_name != "adamw") {
      throw FlagError("train: --opt=" + opt_name + ": expected sgd, rmsprop or adamw");
    }
    if (scheduler != "cosine" && scheduler != "step") {
      throw FlagError("train: --lr-scheduler=" + scheduler + ": expected cosine or step");
    }
    dist::DataParallelOptions dp_options;
    if (grad_comm_dtype == "bf16") {
      dp_options.comm_dtype = DType::bf16;
    } else if (grad_comm_dtype == "f16") {
      dp_options.comm_dtype = DType::f16;
    } else if (grad_comm_dtype != "f32") {
      throw FlagError("train: --grad-comm-dtype=" + grad_comm_dtype +
                      ": expected f32, bf16 or f16");
    }
    dp_options.broadcast_buffers = broadcast_buffers;
    try {
      dp_options.shard = dist::parse_shard_mode(shard);
    } catch (const Error& e) {
      throw FlagError("train: --shard: " + std::string(e.what()));
    }
    if (clip_grad_norm < 0) throw FlagError("train: --clip-grad-norm must be >= 0");
    if (threads > 0) set_num_threads(static_cast<int>(threads));
    manual_seed(static_cast<uint64_t>(seed));
    const mobilenetv3::OptimizerChoice optimizer_choice{opt_name, lr, momentum, weight_decay};
    const mobilenetv3::ScheduleChoice schedule_choice{scheduler, epochs, warmup_epochs, step_epochs,
                                                      lr_gamma};
    if (elastic) {
      // What an elastic member does not do yet is refused, not ignored.
      const std::vector<std::pair<bool, const char*>> unsupported = {
          {dp_options.shard != dist::ShardMode::none, "--shard"},
          {test_only, "--test-only"},
          {on_gpu || !amp.empty(), "--device gpu and --amp"},
          {!loss_log.empty(), "--loss-log"}};
      for (const auto& [given, what] : unsupported) {
        if (given) {
          throw FlagError(std::string("train --elastic: ") + what +
                          ": not supported by elastic training yet (docs/elastic.md)");
        }
      }
      if (!checkpoint_dir.empty() && resume.empty()) {
        // Members start at different times: one that joins a running job finds the job's own
        // checkpoints in the folder, which the fixed-world trainer would refuse as an earlier
        // run's.
        throw FlagError(
            "train --elastic: --checkpoint-dir needs --resume auto (each member resumes from "
            "the folder's newest checkpoint, or starts afresh when it is empty; a member joining "
            "the running job then receives the live state)");
      }
      mobilenetv3::ElasticTrainSettings settings;
      settings.model_name = model_name;
      settings.data_path = data_path;
      settings.output_dir = output_dir;
      settings.img_size = img_size;
      settings.num_classes = num_classes;
      settings.limit_train = limit_train;
      settings.limit_val = limit_val;
      settings.epochs = epochs;
      settings.batch_size = batch_size;
      settings.print_freq = print_freq;
      settings.workers = static_cast<int>(workers);
      settings.seed = static_cast<uint64_t>(seed);
      settings.label_smoothing = label_smoothing;
      settings.clip_grad_norm = clip_grad_norm;
      settings.dp_options = dp_options;
      settings.lr_scheduler = scheduler;
      settings.pretrained = pretrained;
      settings.tensorboard = tensorboard;
      settings.checkpoint_dir = checkpoint_dir;
      settings.resume = resume;
      settings.max_checkpoints = max_checkpoints;
      settings.epoch_interval = epoch_interval;
      settings.step_interval = step_interval;
      settings.export_inference = export_inference;
      settings.make_optimizer = [&](const std::vector<Tensor>& params) {
        return mobilenetv3::make_optimizer(optimizer_choice, nullptr, params);
      };
      settings.make_scheduler = [&](optim::Optimizer& o, int64_t steps_per_epoch) {
        return mobilenetv3::make_scheduler(schedule_choice, o, steps_per_epoch);
      };
      return mobilenetv3::train_elastic(settings);
    }
    // Parameter-server job (dpar-launch --run_mode=ps): a PSERVER process only serves; a
    // TRAINER trains with the servers instead of DataParallel, as trainer_id of num_trainers.
    const ps::PsEnv ps_env = ps::env_from_environment();
    const mobilenetv3::PsSettings ps_settings = ps_flags.settings();
    const bool ps_mode = mobilenetv3::use_ps(ps_settings, ps_env);
    if (ps_mode && ps_env.role == ps::Role::kServer) {
      return mobilenetv3::serve_parameters(ps_env, ps_settings);
    }
    if (ps_mode && dp_options.shard != dist::ShardMode::none) {
      throw FlagError("train: --shard " + shard +
                      " shards DataParallel's state; a ps job keeps it on the servers");
    }
    if (ps_mode && test_only) {
      throw FlagError("train: --test-only evaluates without servers; run it outside a ps job");
    }
    if (ps_mode && !resume.empty() && checkpoint_dir.empty()) {
      throw FlagError(
          "train: --resume in ps mode needs --checkpoint-dir (where the servers saved "
          "their shards)");
    }
    if (!dist_backend.empty() && dist_backend != "nccl" && dist_backend != "gloo") {
      throw FlagError("train: --dist-backend=" + dist_backend + ": expected nccl or gloo");
    }
    if (!ps_mode) {
      // A world of one without a launcher environment.
      dist::InitOptions init_options;
      init_options.backend = dist_backend;
      dist::init_parallel_env(init_options);
    }
    const int rank = ps_mode ? ps_env.trainer_id : dist::get_rank();
    const int world = ps_mode ? ps_env.num_trainers : dist::get_world_size();
    Device train_device = Device::cpu();
    if (on_gpu) {
      if (ps_mode) throw FlagError("train: --device " + device + ": ps mode trains on the CPU");
      const std::string& assigned = dist::parallel_env().device;
      const bool bare = device == "gpu" || device == "cuda";
      train_device = Device::parse(bare && assigned.rfind("gpu:", 0) == 0 ? assigned : device);
      try {
        check_device_available(train_device);
      } catch (const Error& e) {
        throw FlagError("train: --device " + device + ": " + e.what());
      }
    }

    const auto splits = mobilenetv3::load_data(data_path, img_size, limit_train, limit_val);
    const int64_t classes =
        num_classes > 0 ? num_classes : static_cast<int64_t>(splits.train->class_names().size());
    auto model = models::mobilenet_v3(model_name, classes);
    if (!pretrained.empty()) {
      // A weights file or the model part of a training checkpoint.
      io::load_model_weights(*model, pretrained, /*strict=*/true);
      if (rank == 0) std::printf("loaded pretrained weights from %s\n", pretrained.c_str());
    }
    model->train();
    model->to(train_device);
    // Broadcasts rank 0's weights, checks every rank has the same model, and all-reduces
    // gradients in fused buckets during backward. In a world of one it is a plain wrapper.
    dist::DataParallel dp(model, dp_options);

    auto train_sampler =
        std::make_shared<data::DistributedSampler>(splits.train->size(), rank, world,
                                                   /*shuffle=*/true, static_cast<uint64_t>(seed));
    const data::DataLoaderOptions train_options{.batch_size = static_cast<size_t>(batch_size),
                                                .num_workers = static_cast<int>(workers),
                                                .prefetch_batches = 4,
                                                .drop_last = true,
                                                .seed = static_cast<uint64_t>(seed),
                                                // Pinned batches reach a GPU asynchronously.
                                                .pin_memory = train_device.is_cuda()};
    data::DataLoader train_loader(splits.train, train_sampler, train_options);
    data::DataLoader val_loader(
        splits.val,
        // In ps mode every trainer evaluates the whole set (there is no
        // group to add up shards); trainer 0 reports the job's figures.
        std::make_shared<data::DistributedSampler>(splits.val->size(), ps_mode ? 0 : rank,
                                                   ps_mode ? 1 : world, /*shuffle=*/false),
        {.batch_size = static_cast<size_t>(batch_size),
         .num_workers = static_cast<int>(workers),
         .prefetch_batches = 4,
         .drop_last = false,
         .seed = static_cast<uint64_t>(seed),
         .pin_memory = train_device.is_cuda()});
    const int64_t steps_per_epoch = static_cast<int64_t>(train_loader.num_batches());
    if (steps_per_epoch == 0) {
      throw FlagError("train: --batch-size " + std::to_string(batch_size) + " is larger than the " +
                      std::to_string(splits.train->size()) + " training images");
    }

    auto opt = mobilenetv3::make_optimizer(optimizer_choice, &dp, {});
    const DType amp_dtype = amp == "bf16" ? DType::bf16 : DType::f16;
    amp::GradScaler scaler({.enabled = amp == "fp16"});
    std::unique_ptr<optim::LRScheduler> sched =
        mobilenetv3::make_scheduler(schedule_choice, *opt, steps_per_epoch);

    std::string nodes;
    for (const std::string& ep : dist::parallel_env().endpoints) {
      const std::string ip = ep.substr(0, ep.rfind(':'));
      if (nodes.find(ip) == std::string::npos) nodes += (nodes.empty() ? "" : ",") + ip;
    }
    if (nodes.empty()) nodes = "local";
    if (rank == 0) {
      const std::string device_text =
          train_device.is_cpu()
              ? "cpu (" + sysinfo::cpu_model() + ")"
              : train_device.str() + " (" + cuda_device_summary(train_device) + ")";
      std::printf(
          "dpar %s (commit %s) | nodes: %s | device: %s, %d threads per rank | model: %s, %lld "
          "classes, %lld parameters\n",
          version().c_str(), git_commit().c_str(), nodes.c_str(), device_text.c_str(),
          get_num_threads(), model_name.c_str(), static_cast<long long>(classes),
          static_cast<long long>(model->num_parameters()));
      std::printf(
          "data: %s at %s, %zu train / %zu val images, %lldpx | batch size %lld per rank, world "
          "size %d, "
          "global batch %lld | %lld steps/epoch\n",
          splits.kind.c_str(), data_path.c_str(), splits.train->size(), splits.val->size(),
          static_cast<long long>(img_size), static_cast<long long>(batch_size), world,
          static_cast<long long>(batch_size * world), static_cast<long long>(steps_per_epoch));
    }
    std::fflush(stdout);

    // ---- resume: every piece of state that decides the next step --------------------------
    // Model, optimizer (momentum), scheduler step, BN buffers and the dropout generator come
    // from the checkpoint; the data order is a pure function of (seed, epoch), so skipping the
    // batches already trained in the interrupted epoch replays the rest exactly.
    int64_t start_epoch = 0, start_step = 0, global_step = 0;
    int64_t start_consumed = -1;  // >= 0: the resumed epoch's samples a job of another shape took
    mobilenetv3::BestEpoch best;
    const mobilenetv3::RunShape run_shape{model_name, static_cast<uint64_t>(seed), world,
                                          batch_size, steps_per_epoch};
    std::optional<io::Checkpoint> resumed = mobilenetv3::resolve_resume(resume, checkpoint_dir);
    const bool was_resumed = resumed.has_value();
    if (resumed) {
      const io::TrainingState& st = resumed->state;
      const auto from = st.extra.find("resumed_from");
      const mobilenetv3::ResumePosition position = mobilenetv3::restore_run(
          *resumed, from != st.extra.end() ? from->second : resume, run_shape,
          train_sampler->dataset_size(), *model, dp, opt, *sched, test_only, rank);
      start_epoch = st.epoch;
      start_step = position.first_iter;
      start_consumed = position.consumed;
      global_step = st.global_step;
      best = {st.best_top1, st.best_epoch};
      resumed.reset();  // the tensors were copied into the model and optimizer
    }
    if (test_only) {
      const Metrics m = evaluate(dp, val_loader, train_device, rank == 0);
      std::printf(
          "[Eval][Epoch %lld][Avg] loss: %.5f, top1: %.5f, top5: %.5f | peak memory: %.1f MB\n",
          static_cast<long long>(std::max<int64_t>(0, start_epoch - 1)), m.avg_loss(), m.acc1(),
          m.acc5(), sysinfo::peak_rss_mb());
      dist::destroy();
      return 0;
    }

    // After a resume the servers restore the shards they saved with that checkpoint.
    std::unique_ptr<ps::ParameterServerTrainer> ps_trainer;
    if (ps_mode) {
      ps_trainer = mobilenetv3::connect_trainer(*model, *opt, ps_env, ps_settings,
                                                was_resumed ? checkpoint_dir : "", global_step);
    }

    // One Progress per checkpoint file: it starts with the first report and ends with the last.
    std::optional<Progress> checkpoint_progress;
    auto show_checkpoint_progress = [&checkpoint_progress](int64_t done, int64_t total) {
      if (!checkpoint_progress) {
        checkpoint_progress.emplace("checkpoint", static_cast<double>(total) / 1e6, "MB");
      }
      checkpoint_progress->update(static_cast<double>(done) / 1e6);
      if (done == total) checkpoint_progress.reset();
    };
    std::unique_ptr<io::CheckpointManager> checkpoints;
    if (!checkpoint_dir.empty()) {
      checkpoints = std::make_unique<io::CheckpointManager>(
          checkpoint_dir,
          io::CheckpointManagerOptions{
              // resolve_resume already refused a used folder without --resume; a resumed run
              // continues the folder's rotation.
              .on_existing =
                  was_resumed || !resume.empty() ? io::OnExisting::resume : io::OnExisting::refuse,
              .max_num_checkpoints = max_checkpoints,
              .rank = rank,
              .progress = show_checkpoint_progress});
      // Resumed from an older file than the newest: only the files up to it rotate.
      checkpoints->adopt_existing(global_step);
    }
    const mobilenetv3::RunLabels run_labels =
        mobilenetv3::run_labels(splits, scheduler, epochs, img_size);
    // The state after `global_step` steps, positioned at (epoch_pos, step_pos).
    // With --shard every rank writes its optimizer slices first (a set per global step);
    // rank 0's checkpoint file then names the set instead of holding the optimizer state.
    const bool sharded_optimizer = mobilenetv3::optimizer_is_sharded(dp);
    auto optimizer_shards = [&] {
      return sharded_optimizer
                 ? mobilenetv3::save_optimizer_shards(*checkpoints, global_step, dp, *opt)
                 : std::string();
    };
    auto checkpoint_at = [&](int64_t epoch_pos, int64_t step_pos, const std::string& shards) {
      if (ps_trainer) {
        // The servers' shards and optimizer state at this step come first: a trainer checkpoint
        // exists only once its shards do. Servers keep as many steps as the trainer can keep
        // checkpoints for (epoch and step ones, and the best).
        const int keep = max_checkpoints == 0 ? 0 : static_cast<int>(2 * max_checkpoints + 1);
        for (const std::string& shard : ps_trainer->save(checkpoint_dir, keep)) {
          std::printf("ps shard saved: %s\n", shard.c_str());
        }
      }
      io::TrainingState s =
          mobilenetv3::run_state(run_shape, run_labels, epoch_pos, step_pos, global_step);
      s.best_top1 = best.top1;
      s.best_epoch = best.epoch;
      if (epoch_pos == start_epoch && start_consumed >= 0 && step_pos > 0) {
        // An epoch resumed with another world size: its samples so far, over all ranks (the
        // next resume continues from there, whatever its world size).
        s.extra["epoch_samples_consumed"] =
            std::to_string(start_consumed + (step_pos - start_step) * batch_size * world);
      }
      if (!shards.empty()) {
        s.extra[io::kOptimizerShardsKey] = shards;
        s.extra["optimizer"] = opt->name();
      }
      return io::capture_checkpoint(*model, shards.empty() ? opt.get() : nullptr, sched.get(),
                                    std::move(s));
    };
    const mobilenetv3::CheckpointSchedule saving{epoch_interval, step_interval, epochs};
    using mobilenetv3::note_saved;
    const mobilenetv3::DieAtStepHook die_hook(rank);

    FILE* loss_file = nullptr;
    if (!loss_log.empty()) {
      // One file per rank in a multi-process job: <path>.rank<N>. A resumed run appends.
      const std::string path = world > 1 ? loss_log + ".rank" + std::to_string(rank) : loss_log;
      loss_file = std::fopen(path.c_str(), was_resumed ? "a" : "w");
      DPAR_CHECK(loss_file != nullptr, "train: cannot write --loss-log ", path);
    }
    mobilenetv3::TrainLog log(tensorboard, rank, /*gather_ranks=*/!ps_mode);
    Metrics last_eval;
    bool evaluated = false;
    const auto train_start = Clock::now();
    for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
      // A resumed epoch continues after its trained batches (same order, same augmentation).
      const int64_t first_iter = epoch == start_epoch ? start_step : 0;
      std::unique_ptr<data::DataLoader> rest_of_epoch;
      data::DataLoader* loader = &train_loader;
      if (epoch == start_epoch && start_consumed >= 0) {
        // Resumed with another world size or batch size: this job splits the rest of the
        // epoch's order, from the sample the other job had reached.
        rest_of_epoch = std::make_unique<data::DataLoader>(
            splits.train,
            std::make_shared<data::EpochRemainderSampler>(train_sampler, epoch,
                                                          static_cast<size_t>(start_consumed)),
            train_options);
        loader = rest_of_epoch.get();
      } else if (first_iter > 0) {
        rest_of_epoch = std::make_unique<data::DataLoader>(
            splits.train,
            std::make_shared<data::SkipSampler>(train_sampler, epoch,
                                                static_cast<size_t>(first_iter * batch_size)),
            train_options);
        loader = rest_of_epoch.get();
      }
      Metrics window;
      double reader_s = 0, batch_s = 0;
      int64_t iter = first_iter;
      auto t_prev = Clock::now();
      for (data::Batch& batch : loader->epoch(epoch)) {
        const auto t_data = Clock::now();
        reader_s += seconds(t_prev, t_data);
        opt->zero_grad();
        // Non-blocking from pinned memory: the copy runs on the GPU's copy stream while the
        // previous step's kernels finish; the compute stream waits for it.
        batch.images = batch.images.to(train_device, /*non_blocking=*/true);
        batch.labels = batch.labels.to(train_device, /*non_blocking=*/true);
        Tensor logits, loss;
        {
          amp::Autocast autocast(amp_dtype, !amp.empty());
          logits = dp.forward(batch.images);
          loss = cross_entropy(logits, batch.labels, label_smoothing);
        }
        if (ps_trainer) {
          loss.backward();
          ps_trainer->step(batch.labels.numel());  // push gradients, pull the servers' update
        } else {
          // fp16: the loss is scaled so small gradients survive f16; a step whose gradients
          // overflowed is skipped and the scale lowered (bf16 and fp32: the scaler is off).
          scaler.scale(loss).backward();
          if (clip_grad_norm > 0) {
            // The norm over every rank's slice when sharded (one small all-reduce).
            scaler.unscale(*opt);
            optim::clip_grad_norm(*opt, clip_grad_norm);
          }
          scaler.step(*opt);
          scaler.update();
        }
        const double loss_value = loss.item();
        DPAR_CHECK(std::isfinite(loss_value), "train: loss became ", loss_value, " at epoch ",
                   epoch, " iteration ", iter, "; lower --lr");
        if (loss_file)
          std::fprintf(loss_file, "%lld %lld %a\n", static_cast<long long>(epoch),
                       static_cast<long long>(iter), loss_value);
        const double current_lr = opt->lr();
        sched->step();
        {
          NoGradGuard no_grad;
          window.add(loss_value, logits.detach(), batch.labels);
        }
        const auto t_end = Clock::now();
        batch_s += seconds(t_prev, t_end);
        t_prev = t_end;
        ++iter;
        ++global_step;
        die_hook.after_step(global_step);
        if (iter % print_freq == 0 || iter == steps_per_epoch) {
          log.step({.epoch = epoch,
                    .iter = iter,
                    .global_step = global_step,
                    .window = window,
                    .lr = current_lr,
                    .reader_seconds = reader_s,
                    .batch_seconds = batch_s,
                    .batch_size = batch_size,
                    .memory = dp.memory_stats()});
          window = Metrics();
          reader_s = batch_s = 0;
        }
        if (checkpoints && saving.step_due(epoch, iter, steps_per_epoch, global_step)) {
          const auto t0 = Clock::now();
          const std::string shards = optimizer_shards();
          if (rank == 0) note_saved(checkpoints->save_step(checkpoint_at(epoch, iter, shards)), t0);
        }
      }
      if (scaler.is_enabled() && rank == 0) {
        std::printf("amp fp16: loss scale %g, %lld step(s) skipped so far (inf/nan gradients)\n",
                    scaler.get_scale(), static_cast<long long>(scaler.skipped_steps()));
      }
      last_eval = evaluate(dp, val_loader, train_device, rank == 0);
      evaluated = true;
      log.eval(epoch, global_step, last_eval, seconds(train_start, Clock::now()));
      const bool is_best = best.update(last_eval, epoch);
      if (checkpoints && (saving.epoch_due(epoch) || is_best)) {
        const auto t0 = Clock::now();
        const std::string shards = optimizer_shards();
        if (rank == 0 && saving.epoch_due(epoch)) {
          note_saved(checkpoints->save_epoch(checkpoint_at(epoch + 1, 0, shards), epoch, is_best),
                     t0);
        } else if (rank == 0) {
          note_saved(checkpoints->save_best(checkpoint_at(epoch + 1, 0, shards)), t0);
        }
      }
    }
    if (loss_file) std::fclose(loss_file);
    log.close();
    if (!evaluated) {  // resumed from a checkpoint of a finished run: nothing left to train
      std::printf("the checkpoint is at epoch %lld of %lld: nothing left to train\n",
                  static_cast<long long>(start_epoch), static_cast<long long>(epochs));
      last_eval = evaluate(dp, val_loader, train_device, rank == 0);
    }
    if (ps_trainer) {
      const ps::TrainerStats& st = ps_trainer->stats();
      std::printf("ps trainer %d: pushed %.1f MB in %.1f s, pulled %.1f MB in %.1f s\n", rank,
                  static_cast<double>(st.bytes_pushed) / 1e6, st.push_seconds,
                  static_cast<double>(st.bytes_pulled) / 1e6, st.pull_seconds);
      ps_trainer->finish();  // the servers stop once every trainer has finished
    }
    std::printf("final: top1 %.4f, top5 %.4f on %zu validation images after %lld epochs (%.1f s)\n",
                last_eval.acc1(), last_eval.acc5(), splits.val->size(),
                static_cast<long long>(epochs), seconds(train_start, Clock::now()));
    // Only rank 0 writes the model (and exports the inference model).
    if (rank == 0) {
      mobilenetv3::write_outputs(*model, splits,
                                 {.dir = output_dir,
                                  .model_name = model_name,
                                  .img_size = img_size,
                                  .num_classes = classes,
                                  .export_inference = export_inference});
    }
    dist::destroy();
    return 0;
  });
}
