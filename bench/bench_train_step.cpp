// Training throughput of MobileNetV3-small (224x224, random data, SGD momentum), dpar beside
// PyTorch in the same invocation. Prints both figures and the ratio, and each process's peak
// resident memory: whole (the process's high-water mark) and training's own (the peak less
// the resident set before the model was built, which leaves out the interpreter and library
// code PyTorch loads). --profile adds dpar's per-op time table.
#include <cstdio>

#include "bench_util.h"
#include "dpar/core/sysinfo.h"
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
    const double rss_before_mb = sysinfo::current_rss_mb();
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
    const double peak_mb = sysinfo::peak_rss_mb();
    const double training_mb = peak_mb - rss_before_mb;
    const AllocatorStats alloc = allocator_for(Device::cpu()).stats();

    std::printf(
        "bench_train_step: mobilenet_v3_small %lldpx, batch %lld, %lld thread(s), %lld timed "
        "steps\n",
        static_cast<long long>(img), static_cast<long long>(batch), static_cast<long long>(threads),
        static_cast<long long>(steps));
    std::printf("  dpar     %8.2f img/s  (%7.1f ms/step)  peak RSS %7.1f MB, training %7.1f MB\n",
                ours, ours_s * 1e3, peak_mb, training_mb);
    // The caching allocator keeps freed blocks by exact size: what it holds beyond its peak in
    // use is memory no tensor needed at the same time.
    std::printf("           tensor memory: peak in use %.1f MB, held by the allocator %.1f MB\n",
                static_cast<double>(alloc.peak_allocated_bytes) / 1048576.0,
                static_cast<double>(alloc.allocated_bytes + alloc.cached_bytes) / 1048576.0);
    if (peer) {
      const auto p = bench::run_peer("torch_train_step.py",
                                     "--batch " + std::to_string(batch) + " --threads " +
                                         std::to_string(threads) + " --img " + std::to_string(img) +
                                         " --warmup " + std::to_string(warmup) + " --steps " +
                                         std::to_string(steps),
                                     static_cast<int>(threads));
      const double theirs = p.at("img_per_s").get<double>();
      const double their_peak = p.at("peak_rss_mb").get<double>();
      const double their_training = their_peak - p.at("rss_before_mb").get<double>();
      std::printf(
          "  pytorch  %8.2f img/s  (%7.1f ms/step)  peak RSS %7.1f MB, training %7.1f MB"
          "  (torch %s)\n",
          theirs, p.at("ms_per_step").get<double>(), their_peak, their_training,
          p.at("torch").get<std::string>().c_str());
      std::printf(
          "  ratio dpar/pytorch: %.2fx img/s (target >= 2.5); peak RSS %.2fx, training "
          "memory %.2fx (target <= 0.6)\n",
          ours / theirs, peak_mb / their_peak, training_mb / their_training);
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
