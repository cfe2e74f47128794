// ResNet-18 on Fashion-MNIST (32 px) with libtorch's own modules, optimizer and data loader,
// made distributed by dpar: the lines marked "dpar" are all that differ from the
// single-process program (docs/libtorch.md shows the diff). Run alone, or under
//   dpar-launch --nproc_per_node=2 ./train_resnet18 --epochs 1
//   dpar-launch --ips=10.0.0.1,10.0.0.2 ./train_resnet18 ...
// Logs in the MobileNetV3 example's format; rank 0 writes <output_dir>/resnet18.ckpt (dpar's
// CRC-checked checkpoint: weights, optimizer, position) after every epoch and resnet18.pt
// (torch::save) at the end; --resume continues from the checkpoint. --shard optimizer|gradients
// splits the optimizer state (and gradients) across ranks (ZeRO-1/2, docs/sharding.md); its
// optimizer state is then saved as a shard set beside the checkpoint, which loads on any
// number of ranks.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "dpar/core/flags.h"
#include "dpar/torch.h"
#include "fashion_mnist.h"
#include "resnet18.h"

using libtorch_example::FashionMnist;
using libtorch_example::ResNet18;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Loss, top-1 and top-5 over this rank's strided share of the test set, summed over ranks.
void evaluate(ResNet18& model, const at::Tensor& images, const at::Tensor& labels, int64_t epoch,
              int rank, int world) {
  torch::NoGradGuard no_grad;
  model->eval();
  double sums[4] = {0, 0, 0, 0};  // loss, top1, top5, samples
  const at::Tensor mine_x = images.slice(0, rank, images.size(0), world);
  const at::Tensor mine_y = labels.slice(0, rank, labels.size(0), world);
  for (int64_t i = 0; i < mine_x.size(0); i += 256) {
    const at::Tensor x = mine_x.slice(0, i, i + 256), y = mine_y.slice(0, i, i + 256);
    const at::Tensor out = model->forward(x);
    const at::Tensor top5 = std::get<1>(out.topk(5, 1));
    sums[0] += torch::nn::functional::cross_entropy(
                   out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    sums[1] += top5.select(1, 0).eq(y).sum().item<double>();
    sums[2] += top5.eq(y.unsqueeze(1)).any(1).sum().item<double>();
    sums[3] += static_cast<double>(x.size(0));
  }
  at::Tensor total = torch::tensor({sums[0], sums[1], sums[2], sums[3]}, torch::kFloat);
  if (world > 1) dpar::torch::all_reduce(total);  // dpar
  const auto t = total.accessor<float, 1>();
  if (rank == 0) {
    std::printf("[Eval][Epoch %lld][Avg] loss: %.5f, top1: %.5f, top5: %.5f\n",
                static_cast<long long>(epoch), t[0] / t[3], t[1] / t[3], t[2] / t[3]);
    std::fflush(stdout);
  }
  model->train();
}

}  // namespace

int main(int argc, char** argv) {
  return dpar::run_main("train_resnet18", [&] {
    dpar::Flags flags("train_resnet18", "ResNet-18 (libtorch) on Fashion-MNIST, data parallel");
    auto& epochs = flags.add_int("epochs", 2, "epochs to train");
    auto& batch_size = flags.add_int("batch_size", 64, "images per rank per step");
    auto& lr = flags.add_double("lr", 0.05, "SGD learning rate (momentum 0.9)");
    auto& data_dir = flags.add_string("data_dir", dpar::data::FashionMnist::kDebianDir,
                                      "Fashion-MNIST idx files");
    auto& limit = flags.add_int("limit", 0, "train on the first N images only (0: all)");
    auto& output_dir = flags.add_string("output_dir", "output_resnet18", "checkpoint folder");
    auto& resume = flags.add_bool("resume", false, "continue from <output_dir>/resnet18.ckpt");
    auto& log_interval = flags.add_int("log_interval", 20, "steps between log lines");
    auto& seed = flags.add_int("seed", 1, "initialisation and shuffling seed");
    auto& shard = flags.add_string("shard", "none",
                                   "none, optimizer or gradients: what is split across ranks");
    flags.parse(argc, argv);

    dpar::dist::init_parallel_env();                                                // dpar
    const int rank = dpar::dist::get_rank(), world = dpar::dist::get_world_size();  // dpar

    torch::manual_seed(static_cast<uint64_t>(seed));
    ResNet18 model(10);
    dpar::torch::DataParallelOptions options;                // dpar
    options.shard = dpar::dist::parse_shard_mode(shard);     // dpar
    dpar::torch::DataParallel ddp(model, options);           // dpar
    auto optimizer = ddp.make_optimizer<torch::optim::SGD>(  // dpar: was SGD(params, ...)
        torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(5e-4));
    // Sharded, each rank's optimizer holds its slices: its state goes to a shard set that the
    // checkpoint names, not into the checkpoint (which rank 0 alone writes).
    const bool sharded = options.shard != dpar::dist::ShardMode::none && world > 1;

    FashionMnist train_set(data_dir, /*train=*/true, static_cast<size_t>(limit));
    const FashionMnist test_set(data_dir, /*train=*/false);
    const size_t train_size = train_set.size().value();
    dpar::torch::DistributedSampler sampler(train_size,
                                            {.seed = static_cast<uint64_t>(seed)});  // dpar
    auto loader = torch::data::make_data_loader(
        std::move(train_set).map(torch::data::transforms::Stack<>()), sampler,
        torch::data::DataLoaderOptions(static_cast<size_t>(batch_size)));

    const std::string checkpoint = std::string(output_dir) + "/resnet18.ckpt";
    int64_t first_epoch = 0;
    if (resume) {
      const auto state =
          dpar::torch::load_checkpoint(checkpoint, *model, sharded ? nullptr : optimizer.get());
      const auto set = state.extra.find(dpar::io::kOptimizerShardsKey);
      if (set != state.extra.end()) {
        ddp.load_optimizer_state(optimizer, std::string(output_dir) + "/" + set->second);
      } else {
        DPAR_CHECK(!sharded, checkpoint,
                   " holds an unsharded optimizer state; resume it with "
                   "--shard none, or start the sharded run afresh");
      }
      first_epoch = state.epoch;
      if (rank == 0)
        std::printf("resumed from %s at epoch %lld\n", checkpoint.c_str(),
                    static_cast<long long>(first_epoch));
    }
    if (rank == 0) std::filesystem::create_directories(std::string(output_dir));

    const auto start = Clock::now();
    int64_t global_step = 0;
    for (int64_t epoch = first_epoch; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);  // dpar
      double window_loss = 0, window_top1 = 0, window_top5 = 0, reader = 0, compute = 0;
      int64_t window_samples = 0, iter = 0;
      auto t = Clock::now();
      for (auto& batch : *loader) {
        reader += seconds_since(t);
        t = Clock::now();
        optimizer->zero_grad();
        const at::Tensor out = ddp.forward(batch.data);  // dpar: was model->forward
        const at::Tensor loss = torch::nn::functional::cross_entropy(out, batch.target);
        loss.backward();
        optimizer->step();
        ++iter;
        ++global_step;
        const at::Tensor top5 = std::get<1>(out.detach().topk(5, 1));
        const int64_t n = batch.data.size(0);
        window_loss += loss.item<double>() * static_cast<double>(n);
        window_top1 += top5.select(1, 0).eq(batch.target).sum().item<double>();
        window_top5 += top5.eq(batch.target.unsqueeze(1)).any(1).sum().item<double>();
        window_samples += n;
        compute += seconds_since(t);
        if (iter % log_interval == 0 && rank == 0) {
          const double samples = static_cast<double>(window_samples), iters = samples / n;
          std::printf(
              "[Epoch %lld, iter: %lld] top1: %.5f, top5: %.5f, lr: %.6f, loss: %.5f, "
              "avg_reader_cost: %.5f sec, avg_batch_cost: %.5f sec, avg_samples: %lld, "
              "avg_ips: %.2f images/sec.\n",
              static_cast<long long>(epoch), static_cast<long long>(iter), window_top1 / samples,
              window_top5 / samples, static_cast<double>(lr), window_loss / samples, reader / iters,
              (reader + compute) / iters, static_cast<long long>(n), samples / (reader + compute));
          std::fflush(stdout);
        }
        if (iter % log_interval == 0) {
          window_loss = window_top1 = window_top5 = reader = compute = 0;
          window_samples = 0;
        }
        t = Clock::now();
      }
      evaluate(model, test_set.images(), test_set.labels(), epoch, rank, world);
      dpar::io::TrainingState state;
      state.model_name = "resnet18";
      state.epoch = epoch + 1;
      state.global_step = global_step;
      state.batch_size = batch_size;
      if (sharded) {
        const std::string set = "resnet18.optimizer_epoch" + std::to_string(epoch + 1);
        ddp.save_optimizer_state(*optimizer, std::string(output_dir) + "/" + set);  // every rank
        state.extra[dpar::io::kOptimizerShardsKey] = set;
      }
      dpar::torch::save_checkpoint(checkpoint, *model, sharded ? nullptr : optimizer.get(),
                                   state);  // dpar: rank 0 writes
      if (sharded && rank == 0) {  // the set the previous checkpoint named is no longer needed
        std::filesystem::remove_all(std::string(output_dir) + "/resnet18.optimizer_epoch" +
                                    std::to_string(epoch));
      }
    }
    if (rank == 0) {
      torch::save(model, std::string(output_dir) + "/resnet18.pt");
      std::printf("%s; trained %lld epochs in %.1f s on %d rank(s); saved %s/resnet18.pt\n",
                  ddp.bucket_summary().c_str(), static_cast<long long>(epochs - first_epoch),
                  seconds_since(start), world, std::string(output_dir).c_str());
    }
    dpar::dist::destroy();  // dpar
    return 0;
  });
}
