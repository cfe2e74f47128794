// What an elastic job pays per step to survive a failure without losing the step: the in-memory
// commit of dist::ElasticState for MobileNetV3-small with SGD momentum (parameters, buffers,
// momentum, learning rate, counters), beside one training step (batch 16, 224 px) and beside
// what the restart-from-disk path pays per checkpoint (save_checkpoint: serialise, write, fsync).
// The peer is the commit Horovod's elastic TorchState.save() makes in PyTorch (deepcopy of the
// model's and the optimizer's state_dict), run in the same invocation.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_util.h"
#include "dpar/distributed/elastic.h"
#include "dpar/dpar.h"
#include "dpar/io/checkpoint.h"
#include "dpar/optim/sgd.h"
#include "model/mobilenet_v3.h"

using namespace dpar;

namespace {

template <class Fn>
double median_ms(int64_t reps, Fn&& fn) {
  std::vector<double> ms;
  for (int64_t i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(bench::seconds_since(t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("bench_elastic_commit", [&] {
    Flags flags("bench_elastic_commit",
                "In-memory elastic commit vs a step, a checkpoint, Horovod's");
    auto& batch = flags.add_int("batch", 16, "images per step");
    auto& img = flags.add_int("img", 224, "image side");
    auto& threads = flags.add_int("threads", 1, "intra-op threads (both frameworks)");
    auto& steps = flags.add_int("steps", 3, "timed training steps");
    auto& commits = flags.add_int("commits", 20, "timed commits (median)");
    auto& peer = flags.add_bool("peer", true, "also run the PyTorch peer");
    auto& dir = flags.add_string("dir", "", "where the checkpoint goes (default: the temp folder)");
    flags.parse(argc, argv);
    set_num_threads(static_cast<int>(threads));

    manual_seed(0);
    std::shared_ptr<nn::Module> model = models::mobilenet_v3_small(1000);
    optim::SGD optimizer(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 4e-5});
    model->train();
    const auto [x, y] = bench::random_batch(batch, img, 1000, 1);
    auto step = [&] {
      optimizer.zero_grad();
      cross_entropy(model->forward(x), y).backward();
      optimizer.step();
    };
    step();  // momentum buffers exist from here on, as in a running job
    const double step_ms = median_ms(steps, step);

    int64_t counter = 0;
    dist::ElasticState state;
    state.add_module("model", *model);
    state.add_optimizer("optimizer", optimizer);
    state.add_counter("step", counter);
    state.commit();  // the first commit allocates; later ones copy into its buffers
    const double commit_ms = median_ms(commits, [&] { state.commit(); });
    const double restore_ms =
        median_ms(std::max<int64_t>(1, commits / 4), [&] { state.restore(); });

    const std::string folder =
        dir.empty() ? std::filesystem::temp_directory_path().string() : std::string(dir);
    const std::string path = folder + "/bench_elastic_commit.ckpt";
    const double checkpoint_ms = median_ms(3, [&] {
      io::save_checkpoint(path, io::capture_checkpoint(*model, &optimizer, nullptr, {}));
    });
    std::filesystem::remove(path);

    std::printf(
        "bench_elastic_commit: mobilenet_v3_small %lldpx, batch %lld, %lld thread(s); "
        "state %.1f MB\n",
        static_cast<long long>(img), static_cast<long long>(batch), static_cast<long long>(threads),
        static_cast<double>(state.committed_bytes()) / 1048576.0);
    std::printf(
        "  dpar     commit %7.2f ms (%.2f%% of a %.0f ms step), restore %.2f ms, "
        "checkpoint to disk %.1f ms\n",
        commit_ms, 100.0 * commit_ms / step_ms, step_ms, restore_ms, checkpoint_ms);
    if (peer) {
      const auto p =
          bench::run_peer("torch_elastic_commit.py",
                          "--batch " + std::to_string(batch) + " --img " + std::to_string(img) +
                              " --threads " + std::to_string(threads) + " --steps " +
                              std::to_string(steps) + " --commits " + std::to_string(commits),
                          static_cast<int>(threads));
      const double theirs = p.at("commit_ms").get<double>();
      const double their_step = p.at("step_ms").get<double>();
      std::printf(
          "  PyTorch  commit %7.2f ms (%.2f%% of a %.0f ms step; Horovod's TorchState.save: "
          "deepcopy of the state_dicts), torch %s\n",
          theirs, 100.0 * theirs / their_step, their_step,
          p.at("torch").get<std::string>().c_str());
      std::printf("  ratio    dpar's commit takes %.2fx PyTorch's time\n", commit_ms / theirs);
    }
    return 0;
  });
}
