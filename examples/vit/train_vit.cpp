// Trains the ViT-Tiny of model/vision_transformer.h on Fashion-MNIST (1 channel at 32 px, its
// own statistics, random horizontal flips) with AdamW and linear warm-up + cosine decay; one
// process, or one rank of a dpar-launch job (DataParallel, DistributedSampler). Per epoch:
// rank 0 evaluates the test split, writes a checkpoint (CheckpointManager: a used folder is
// refused unless --resume) and TensorBoard scalars (loss, lr, top-1). At the end rank 0 exports
// the model to ONNX (<out>/export/inference.onnx, opset 17).
//   build/examples/vit/train_vit --epochs 5 --out out/vit
//   dpar-launch --nproc_per_node=2 build/examples/vit/train_vit --epochs 5 --out out/vit2
#include <chrono>
#include <cstdio>

#include "dpar/dpar.h"
#include "model/vision_transformer.h"
#include "model/vision_transformer_onnx.h"

using namespace dpar;

namespace {

double top1(nn::Module& model, const data::Dataset& test, int64_t batch) {
  model.eval();
  NoGradGuard no_grad;
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&test, [](const data::Dataset*) {}),
                          std::make_shared<data::SequentialSampler>(test.size()),
                          {.batch_size = static_cast<size_t>(batch), .num_workers = 1});
  int64_t correct = 0, seen = 0;
  for (data::Batch& b : loader.epoch(0)) {
    const auto pred = argmax(model.forward(b.images), 1).to_int_vector();
    const auto want = b.labels.to_int_vector();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == want[i] ? 1 : 0;
    seen += static_cast<int64_t>(pred.size());
  }
  model.train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(seen);
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("train_vit", [&] {
    Flags flags("train_vit", "Trains ViT-Tiny on Fashion-MNIST (one process or under dpar-launch)");
    auto& data_dir =
        flags.add_string("data", data::FashionMnist::kDebianDir, "Fashion-MNIST idx files");
    auto& out = flags.add_string("out", "out/vit", "checkpoints, TensorBoard files and the export");
    auto& epochs = flags.add_int("epochs", 5, "passes over the training data");
    auto& batch = flags.add_int("batch-size", 128, "images per step on each rank");
    auto& lr = flags.add_double("lr", 1e-3, "peak learning rate (AdamW)");
    auto& weight_decay = flags.add_double("weight-decay", 0.05, "AdamW's decoupled weight decay");
    auto& warmup = flags.add_double("warmup-epochs", 1.0, "linear warm-up before the cosine decay");
    auto& threads =
        flags.add_int("threads", 0, "intra-op threads (0: OMP_NUM_THREADS or all cores)");
    auto& limit_train = flags.add_int("limit-train", 0, "first N training images only (0: all)");
    auto& limit_test = flags.add_int("limit-test", 0, "first N test images only (0: all)");
    auto& resume = flags.add_bool("resume", false, "continue the run in --out");
    auto& seed = flags.add_int("seed", 0, "initialisation, sampler and augmentation seed");
    auto& do_export = flags.add_bool("export", true, "rank 0 exports <out>/export/inference.onnx");
    flags.parse(argc, argv);
    if (threads > 0) set_num_threads(static_cast<int>(threads));

    dist::init_parallel_env();
    const int rank = dist::get_rank(), world = dist::get_world_size();
    manual_seed(static_cast<uint64_t>(seed));
    auto model = std::make_shared<models::VisionTransformer>(models::vit_tiny_config(10, 1));
    dist::DataParallel dp(model);
    optim::AdamW opt(dp.parameters(), {.lr = lr, .weight_decay = weight_decay});

    const std::vector<std::shared_ptr<const data::Transform>> augment{
        std::make_shared<data::Resize>(32), std::make_shared<data::RandomHorizontalFlip>(0.5)};
    auto train = std::make_shared<data::FashionMnist>(data_dir, data::Split::Train,
                                                      data::FashionMnist::transform(augment),
                                                      static_cast<size_t>(limit_train));
    const data::FashionMnist test(
        data_dir, data::Split::Test,
        data::FashionMnist::transform({std::make_shared<data::Resize>(32)}),
        static_cast<size_t>(limit_test));
    auto sampler = std::make_shared<data::DistributedSampler>(train->size(), rank, world, true,
                                                              static_cast<uint64_t>(seed));
    data::DataLoader loader(train, sampler,
                            {.batch_size = static_cast<size_t>(batch),
                             .num_workers = 1,
                             .drop_last = true,
                             .seed = static_cast<uint64_t>(seed)});
    const int64_t steps_per_epoch = static_cast<int64_t>(loader.num_batches());
    optim::CosineWarmupLR schedule(
        opt, epochs * steps_per_epoch,
        static_cast<int64_t>(warmup * static_cast<double>(steps_per_epoch)));

    io::CheckpointManager checkpoints(
        out + "/checkpoints",
        {.on_existing = resume ? io::OnExisting::resume : io::OnExisting::refuse, .rank = rank});
    int64_t first_epoch = 0, global_step = 0;
    if (resume) {
      auto ckpt = io::load_on_rank0_and_broadcast([&] { return checkpoints.load_latest_valid(); });
      if (ckpt) {
        io::restore_checkpoint(*ckpt, *model, &opt, &schedule, out);
        first_epoch = ckpt->state.epoch;
        global_step = ckpt->state.global_step;
      }
    }
    std::unique_ptr<io::SummaryWriter> tb;
    if (rank == 0) tb = std::make_unique<io::SummaryWriter>(out + "/tensorboard");
    if (rank == 0) {
      int64_t parameters = 0;
      for (const Tensor& p : model->parameters()) parameters += p.numel();
      std::printf("train_vit: ViT-Tiny (%lld parameters), %d rank(s), %lld steps/epoch of %lld\n",
                  static_cast<long long>(parameters), world,
                  static_cast<long long>(steps_per_epoch), static_cast<long long>(batch));
      std::fflush(stdout);
    }
    double best = -1;
    for (int64_t epoch = first_epoch; epoch < epochs; ++epoch) {
      dp.train();
      const auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0;
      for (data::Batch& b : loader.epoch(epoch)) {
        Tensor loss = cross_entropy(dp.forward(b.images), b.labels);
        opt.zero_grad();
        loss.backward();
        opt.step();
        schedule.step();
        ++global_step;
        const double l = loss.item();
        loss_sum += l;
        if (tb && global_step % 50 == 0) {
          tb->add_scalars({{"train/loss", l}, {"train/lr", opt.lr()}}, global_step);
        }
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      io::TrainingState state;
      state.model_name = "vit_tiny";
      state.epoch = epoch + 1;
      state.global_step = global_step;
      state.steps_per_epoch = steps_per_epoch;
      state.batch_size = batch;
      state.world_size = world;
      state.seed = static_cast<uint64_t>(seed);
      if (rank == 0) {
        const double acc = top1(*model, test, 250);
        state.best_top1 = best = std::max(best, acc);
        std::printf("epoch %lld: loss %.4f, top-1 %.2f%%, %.1f s (%.1f img/s per rank)\n",
                    static_cast<long long>(epoch), loss_sum / static_cast<double>(steps_per_epoch),
                    acc, seconds, static_cast<double>(steps_per_epoch * batch) / seconds);
        std::fflush(stdout);
        tb->add_scalar("eval/top1", acc, global_step);
        tb->flush();
      }
      checkpoints.save_epoch(io::capture_checkpoint(*model, &opt, &schedule, state), epoch,
                             rank == 0 && best == state.best_top1);
    }
    if (rank == 0 && do_export) {
      model->eval();
      const io::OnnxExportResult r = models::export_vision_transformer(*model, out + "/export");
      std::printf("exported %s (%lld nodes, %lld parameters)\n", r.model_path.c_str(),
                  static_cast<long long>(r.num_nodes), static_cast<long long>(r.num_parameters));
    }
    dist::destroy();
    return 0;
  });
}
