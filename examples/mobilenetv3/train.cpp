// Trains MobileNetV3 (small or large) on Fashion-MNIST or an ImageNet-style image folder, in
// one process or as one rank of a job started by dpar-launch (init_parallel_env +
// DataParallel + DistributedSampler; the same binary either way). Log lines follow
// PaddlePaddle's format so existing log tooling keeps working.
//   train --model mobilenet_v3_small --data-path /usr/share/datasets/fashion-mnist
//         --img-size 32 --epochs 3 --batch-size 64 --lr 0.1
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "dpar/core/sysinfo.h"
#include "dpar/data/dataloader.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"
#include "dpar/io/safetensors.h"
#include "dpar/nn/weights.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/lr_scheduler.h"
#include "dpar/optim/rmsprop.h"
#include "dpar/optim/sgd.h"
#include "model/mobilenet_v3.h"
#include "train_data.h"

using namespace dpar;
using Clock = std::chrono::steady_clock;

namespace {

struct Metrics {
  double loss = 0, top1 = 0, top5 = 0;
  int64_t samples = 0;
  void add(double batch_loss, const Tensor& logits, const Tensor& labels) {
    const int64_t n = labels.numel();
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    const std::vector<int64_t> top = topk_indices(logits, k).to_int_vector();
    const std::vector<int64_t> y = labels.to_int_vector();
    for (int64_t i = 0; i < n; ++i) {
      top1 += top[static_cast<size_t>(i * k)] == y[static_cast<size_t>(i)];
      for (int64_t j = 0; j < k; ++j) {
        if (top[static_cast<size_t>(i * k + j)] == y[static_cast<size_t>(i)]) {
          top5 += 1;
          break;
        }
      }
    }
    loss += batch_loss * static_cast<double>(n);
    samples += n;
  }
  double avg_loss() const { return samples ? loss / static_cast<double>(samples) : 0; }
  double acc1() const { return samples ? top1 / static_cast<double>(samples) : 0; }
  double acc5() const { return samples ? top5 / static_cast<double>(samples) : 0; }
};

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Each rank evaluates its shard of the validation set; the sums are all-reduced so every rank
// reports the same figures (padding of the last shard counts a few images twice, as in DDP).
Metrics evaluate(nn::Module& model, data::DataLoader& loader) {
  model.eval();
  NoGradGuard no_grad;
  Metrics m;
  for (data::Batch& batch : loader.epoch(0)) {
    Tensor logits = model.forward(batch.images);
    m.add(cross_entropy(logits, batch.labels).item(), logits, batch.labels);
  }
  if (dist::get_world_size() > 1) {
    Tensor sums = Tensor::from_vector(std::vector<float>{static_cast<float>(m.loss), static_cast<float>(m.top1),
                                                         static_cast<float>(m.top5), static_cast<float>(m.samples)},
                                      {4});
    dist::default_group().allreduce({sums})->wait();
    const std::vector<float> v = sums.to_float_vector();
    m.loss = v[0];
    m.top1 = v[1];
    m.top5 = v[2];
    m.samples = static_cast<int64_t>(v[3]);
  }
  model.train();
  return m;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, nn::Module& model,
                                                 double lr, double momentum, double wd) {
  if (name == "sgd" || name == "momentum") {
    return std::make_unique<optim::SGD>(model.parameters(),
                                        optim::SGDOptions{.lr = lr, .momentum = momentum, .weight_decay = wd});
  }
  if (name == "rmsprop") {
    return std::make_unique<optim::RMSprop>(
        model.parameters(), optim::RMSpropOptions{.lr = lr, .weight_decay = wd, .momentum = momentum});
  }
  if (name == "adamw") {
    return std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = lr, .weight_decay = wd});
  }
  throw FlagError("train: --opt=" + name + ": expected sgd, rmsprop or adamw");
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("train", [&] {
    Flags flags("train", "Trains MobileNetV3 on Fashion-MNIST or an ImageNet-style folder.");
    auto& model_name = flags.add_string("model", "mobilenet_v3_small", "mobilenet_v3_small or mobilenet_v3_large");
    auto& data_path = flags.add_string("data-path", data::FashionMnist::kDebianDir,
                                       "Fashion-MNIST idx folder, or a folder with train/ and val/");
    auto& epochs = flags.add_int("epochs", 3, "passes over the training data");
    auto& batch_size = flags.add_int("batch-size", 64, "images per step (per rank)");
    auto& opt_name = flags.add_string("opt", "sgd", "optimizer: sgd, rmsprop or adamw");
    auto& lr = flags.add_double("lr", 0.1, "peak learning rate");
    auto& momentum = flags.add_double("momentum", 0.9, "momentum (sgd, rmsprop)");
    auto& weight_decay = flags.add_double("weight-decay", 4e-5, "weight decay");
    auto& scheduler = flags.add_string("lr-scheduler", "cosine", "cosine (with warmup) or step");
    auto& warmup_epochs = flags.add_double("warmup-epochs", 0.3, "linear warmup length in epochs (cosine)");
    auto& step_epochs = flags.add_int("lr-step-epochs", 1, "epochs per decay (step scheduler)");
    auto& lr_gamma = flags.add_double("lr-gamma", 0.1, "decay factor (step scheduler)");
    auto& label_smoothing = flags.add_double("label-smoothing", 0.0, "cross-entropy label smoothing");
    auto& img_size = flags.add_int("img-size", 32, "input image side");
    auto& num_classes = flags.add_int("num-classes", 0, "classes (0: from the data)");
    auto& seed = flags.add_int("seed", 0, "seed for initialisation, shuffling and augmentation");
    auto& threads = flags.add_int("threads", 0, "intra-op threads (0: OMP_NUM_THREADS or all cores)");
    auto& workers = flags.add_int("workers", 1, "data loader threads");
    auto& pretrained = flags.add_string("pretrained", "", "weights (.safetensors) to start from");
    auto& output_dir = flags.add_string("output-dir", "", "where to write the trained weights");
    auto& print_freq = flags.add_int("print-freq", 50, "log every N iterations");
    auto& limit_train = flags.add_int("limit-train", 0, "use only the first N training images (0: all)");
    auto& limit_val = flags.add_int("limit-val", 0, "use only the first N validation images (0: all)");
    auto& loss_log = flags.add_string("loss-log", "", "write every step's loss (exact hex) to this file");
    flags.parse(argc, argv);

    if (epochs < 1) throw FlagError("train: --epochs must be >= 1");
    if (batch_size < 1) throw FlagError("train: --batch-size must be >= 1");
    if (img_size < 16) throw FlagError("train: --img-size must be >= 16");
    if (print_freq < 1) throw FlagError("train: --print-freq must be >= 1");
    // Validate every choice before loading data, so usage errors come back at once.
    if (opt_name != "sgd" && opt_name != "momentum" && opt_name != "rmsprop" && opt_name != "adamw") {
      throw FlagError("train: --opt=" + opt_name + ": expected sgd, rmsprop or adamw");
    }
    if (scheduler != "cosine" && scheduler != "step") {
      throw FlagError("train: --lr-scheduler=" + scheduler + ": expected cosine or step");
    }
    if (threads > 0) set_num_threads(static_cast<int>(threads));
    manual_seed(static_cast<uint64_t>(seed));
    dist::init_parallel_env();  // a world of one without a launcher environment
    const int rank = dist::get_rank(), world = dist::get_world_size();

    const auto splits = mobilenetv3::load_data(data_path, img_size, limit_train, limit_val);
    const int64_t classes = num_classes > 0 ? num_classes : static_cast<int64_t>(splits.train->class_names().size());
    auto model = models::mobilenet_v3(model_name, classes);
    if (!pretrained.empty()) {
      const nn::LoadReport report = nn::load_weights(*model, pretrained, /*strict=*/true);
      std::printf("loaded pretrained weights from %s\n", pretrained.c_str());
      (void)report;
    }
    model->train();
    // Broadcasts rank 0's weights, checks every rank has the same model, and all-reduces
    // gradients in fused buckets during backward. In a world of one it is a plain wrapper.
    dist::DataParallel dp(model);

    data::DataLoader train_loader(splits.train,
                                  std::make_shared<data::DistributedSampler>(splits.train->size(), rank, world,
                                                                             /*shuffle=*/true,
                                                                             static_cast<uint64_t>(seed)),
                                  {.batch_size = static_cast<size_t>(batch_size), .num_workers = static_cast<int>(workers),
                                   .prefetch_batches = 4, .drop_last = true, .seed = static_cast<uint64_t>(seed)});
    data::DataLoader val_loader(splits.val,
                                std::make_shared<data::DistributedSampler>(splits.val->size(), rank, world,
                                                                           /*shuffle=*/false),
                                {.batch_size = static_cast<size_t>(batch_size), .num_workers = static_cast<int>(workers),
                                 .prefetch_batches = 4, .drop_last = false, .seed = static_cast<uint64_t>(seed)});
    const int64_t steps_per_epoch = static_cast<int64_t>(train_loader.num_batches());
    if (steps_per_epoch == 0) {
      throw FlagError("train: --batch-size " + std::to_string(batch_size) + " is larger than the " +
                      std::to_string(splits.train->size()) + " training images");
    }

    auto opt = make_optimizer(opt_name, *model, lr, momentum, weight_decay);
    std::unique_ptr<optim::LRScheduler> sched;
    if (scheduler == "cosine") {
      sched = std::make_unique<optim::CosineWarmupLR>(
          *opt, epochs * steps_per_epoch, static_cast<int64_t>(warmup_epochs * static_cast<double>(steps_per_epoch)));
    } else if (scheduler == "step") {
      sched = std::make_unique<optim::StepLR>(*opt, step_epochs * steps_per_epoch, lr_gamma);
    } else {
      throw FlagError("train: --lr-scheduler=" + scheduler + ": expected cosine or step");
    }

    std::string nodes;
    for (const std::string& ep : dist::parallel_env().endpoints) {
      const std::string ip = ep.substr(0, ep.rfind(':'));
      if (nodes.find(ip) == std::string::npos) nodes += (nodes.empty() ? "" : ",") + ip;
    }
    if (nodes.empty()) nodes = "local";
    if (rank == 0) {
      std::printf("dpar %s (commit %s) | nodes: %s | device: cpu (%s), %d threads per rank | model: %s, %lld "
                  "classes, %lld parameters\n",
                  version().c_str(), git_commit().c_str(), nodes.c_str(), sysinfo::cpu_model().c_str(),
                  get_num_threads(), model_name.c_str(), static_cast<long long>(classes),
                  static_cast<long long>(model->num_parameters()));
      std::printf("data: %s at %s, %zu train / %zu val images, %lldpx | batch size %lld per rank, world size %d, "
                  "global batch %lld | %lld steps/epoch\n",
                  splits.kind.c_str(), data_path.c_str(), splits.train->size(), splits.val->size(),
                  static_cast<long long>(img_size), static_cast<long long>(batch_size), world,
                  static_cast<long long>(batch_size * world), static_cast<long long>(steps_per_epoch));
    }
    std::fflush(stdout);

    FILE* loss_file = nullptr;
    if (!loss_log.empty()) {
      // One file per rank in a multi-process job: <path>.rank<N>.
      const std::string path = world > 1 ? loss_log + ".rank" + std::to_string(rank) : loss_log;
      loss_file = std::fopen(path.c_str(), "w");
      DPAR_CHECK(loss_file != nullptr, "train: cannot write --loss-log ", path);
    }
    Metrics last_eval;
    const auto train_start = Clock::now();
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      Metrics window;
      double reader_s = 0, batch_s = 0;
      int64_t iter = 0;
      auto t_prev = Clock::now();
      for (data::Batch& batch : train_loader.epoch(epoch)) {
        const auto t_data = Clock::now();
        reader_s += seconds(t_prev, t_data);
        opt->zero_grad();
        Tensor logits = dp.forward(batch.images);
        Tensor loss = cross_entropy(logits, batch.labels, label_smoothing);
        loss.backward();
        opt->step();
        const double loss_value = loss.item();
        DPAR_CHECK(std::isfinite(loss_value), "train: loss became ", loss_value, " at epoch ", epoch,
                   " iteration ", iter, "; lower --lr");
        if (loss_file) std::fprintf(loss_file, "%lld %lld %a\n", static_cast<long long>(epoch),
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
        if (iter % print_freq == 0 || iter == steps_per_epoch) {
          const double n = static_cast<double>(window.samples);
          const double iters = static_cast<double>(window.samples) / static_cast<double>(batch_size);
          std::printf("[Epoch %lld, iter: %lld] top1: %.5f, top5: %.5f, lr: %.6f, loss: %.5f, "
                      "avg_reader_cost: %.5f sec, avg_batch_cost: %.5f sec, avg_samples: %lld, "
                      "avg_ips: %.2f images/sec.\n",
                      static_cast<long long>(epoch), static_cast<long long>(iter), window.acc1(),
                      window.acc5(), current_lr, window.avg_loss(), reader_s / iters, batch_s / iters,
                      static_cast<long long>(batch_size), n / batch_s);
          std::fflush(stdout);
          window = Metrics();
          reader_s = batch_s = 0;
        }
      }
      last_eval = evaluate(dp, val_loader);
      std::printf("[Eval][Epoch %lld][Avg] loss: %.5f, top1: %.5f, top5: %.5f | peak memory: %.1f MB, "
                  "elapsed %.1f s\n",
                  static_cast<long long>(epoch), last_eval.avg_loss(), last_eval.acc1(), last_eval.acc5(),
                  sysinfo::peak_rss_mb(), seconds(train_start, Clock::now()));
      std::fflush(stdout);
    }
    if (loss_file) std::fclose(loss_file);
    std::printf("final: top1 %.4f, top5 %.4f on %zu validation images after %lld epochs (%.1f s)\n",
                last_eval.acc1(), last_eval.acc5(), splits.val->size(), static_cast<long long>(epochs),
                seconds(train_start, Clock::now()));
    if (!output_dir.empty() && rank == 0) {  // only rank 0 writes the model
      std::filesystem::create_directories(output_dir);
      const std::string path = output_dir + "/" + model_name + ".safetensors";
      nn::save_weights(*model, path);
      std::printf("saved weights to %s\n", path.c_str());
    }
    dist::destroy();
    return 0;
  });
}
