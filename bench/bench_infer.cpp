// Eval-mode forward latency of MobileNetV3-small (224x224), dpar beside PyTorch eager and
// TorchScript (frozen + optimize_for_inference) in the same invocation.
#include <cstdio>

#include "bench_util.h"
#include "dpar/dpar.h"
#include "model/mobilenet_v3.h"

using namespace dpar;

int main(int argc, char** argv) {
  return run_main("bench_infer", [&] {
    Flags flags("bench_infer", "MobileNetV3-small eval forward: dpar vs PyTorch");
    auto& batches = flags.add_string("batch", "1,32", "comma-separated batch sizes");
    auto& threads = flags.add_int("threads", 1, "intra-op threads (both frameworks)");
    auto& img = flags.add_int("img", 224, "image side");
    auto& warmup = flags.add_int("warmup", 3, "untimed runs");
    auto& iters = flags.add_int("iters", 20, "timed runs");
    auto& peer = flags.add_bool("peer", true, "also run the PyTorch peer");
    auto& profile = flags.add_bool("profile", false, "print dpar's per-op profile");
    flags.parse(argc, argv);

    set_num_threads(static_cast<int>(threads));
    manual_seed(0);
    auto model = models::mobilenet_v3_small(1000);
    model->eval();
    NoGradGuard no_grad;
    std::printf("bench_infer: mobilenet_v3_small %lldpx eval forward, %lld thread(s)\n",
                static_cast<long long>(img), static_cast<long long>(threads));
    size_t pos = 0;
    while (pos <= batches.size()) {
      const size_t comma = batches.find(',', pos);
      const int64_t b = std::stoll(batches.substr(pos, comma - pos));
      pos = comma == std::string::npos ? batches.size() + 1 : comma + 1;
      const Tensor x = bench::random_batch(b, img, 1000, 1).images;
      for (int64_t i = 0; i < warmup; ++i) model->forward(x);
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < iters; ++i) model->forward(x);
      const double ours_ms = bench::seconds_since(t0) / static_cast<double>(iters) * 1e3;
      std::printf("  batch %3lld: dpar %8.2f ms", static_cast<long long>(b), ours_ms);
      if (peer) {
        const auto p = bench::run_peer("torch_infer.py",
                                       "--batch " + std::to_string(b) + " --threads " +
                                           std::to_string(threads) + " --img " + std::to_string(img),
                                       static_cast<int>(threads));
        const double eager = p.at("eager_ms").get<double>(), frozen = p.at("frozen_ms").get<double>();
        std::printf(" | pytorch eager %8.2f ms (ratio %.2fx) | torchscript frozen %8.2f ms (ratio %.2fx)",
                    eager, ours_ms / eager, frozen, ours_ms / frozen);
      }
      std::printf("\n");
      if (profile) {
        profiler::reset();
        profiler::set_enabled(true);
        for (int64_t i = 0; i < iters; ++i) model->forward(x);
        profiler::set_enabled(false);
        std::printf("per-op profile (batch %lld, %lld runs):\n%s", static_cast<long long>(b),
                    static_cast<long long>(iters), profiler::report().c_str());
      }
    }
    return 0;
  });
}
