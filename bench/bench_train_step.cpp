// Training throughput of MobileNetV3-small (224x224, random data, SGD momentum), dpar beside
// PyTorch in the same invocation. Prints both figures and the ratio; --profile adds dpar's
// per-op time table.
#include <cstdio>

#include "bench_util.h"
#include "dpar/dpar.h"
#include "dpar/optim/sgd.h"
#include "model/mobilenet_v3.h"

using namespace dpar;

int main(int argc, char** argv) {
  return run_main("bench_train_step", [&] {
    Flags flags("bench_train_step", "MobileNetV3-small training steps: dpar vs PyTorch");
    auto& batch = flags.add_int("batch", 16, "images per step");
    auto& threads = flags.add_int("threads", 1, "intra-op threads (both frameworks)");
    auto& img = flags.add_int("img", 224, "image side");
    auto& warmup = flags.add_int("warmup", 2, "untimed steps");
    auto& steps = flags.add_int("steps", 5, "timed steps");
    auto& peer = flags.add_bool("peer", true, "also run the PyTorch peer");
    auto& profile = flags.add_bool("profile", false, "print dpar's per-op profile");
    flags.parse(argc, argv);

    set_num_threads(static_cast<int>(threads));
    manual_seed(0);
    auto model = models::mobilenet_v3_small(1000);
    model->train();
    optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 4e-5});
    const auto [x, y] = bench::random_batch(batch, img, 1000, 1);

    auto step = [&] {
      opt.zero_grad();
      Tensor loss = cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();
    };
    for (int64_t i = 0; i < warmup; ++i) step();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) step();
    const double ours_s = bench::seconds_since(t0) / static_cast<double>(steps);
    const double ours = static_cast<double>(batch) / ours_s;

    std::printf("bench_train_step: mobilenet_v3_small %lldpx, batch %lld, %lld thread(s), %lld timed steps\n",
                static_cast<long long>(img), static_cast<long long>(batch),
                static_cast<long long>(threads), static_cast<long long>(steps));
    std::printf("  dpar     %8.2f img/s  (%7.1f ms/step)\n", ours, ours_s * 1e3);
    if (peer) {
      const auto p = bench::run_peer("torch_train_step.py",
                                     "--batch " + std::to_string(batch) + " --threads " +
                                         std::to_string(threads) + " --img " + std::to_string(img) +
                                         " --warmup " + std::to_string(warmup) + " --steps " +
                                         std::to_string(steps),
                                     static_cast<int>(threads));
      const double theirs = p.at("img_per_s").get<double>();
      std::printf("  pytorch  %8.2f img/s  (%7.1f ms/step, torch %s)\n", theirs,
                  p.at("ms_per_step").get<double>(), p.at("torch").get<std::string>().c_str());
      std::printf("  ratio dpar/pytorch: %.2fx\n", ours / theirs);
    }
    if (profile) {
      profiler::reset();
      profiler::set_enabled(true);
      for (int64_t i = 0; i < steps; ++i) step();
      profiler::set_enabled(false);
      std::printf("\nper-op profile over %lld steps:\n%s", static_cast<long long>(steps),
                  profiler::report().c_str());
    }
    return 0;
  });
}
