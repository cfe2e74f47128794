// Data-parallel training throughput: MobileNetV3-small 224x224, 2 ranks x 1 thread, batch 16
// per rank, dpar DataParallel (Gloo) beside PyTorch DDP (gloo) in the same invocation. Also
// reports scaling efficiency (2 ranks vs 2 x one process) and how much of each step's
// communication was hidden behind backward.
//
// Run without arguments: the driver runs one process alone, then itself under dpar-launch
// with --worker, then the PyTorch peer (bench/peers/torch_ddp.py).
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include "bench_util.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"
#include "model/mobilenet_v3.h"

using namespace dpar;

namespace {

struct StepResult {
  double seconds_per_step = 0;
  double comm_seconds = 0;     // per step, all-reduce time summed over buckets
  double exposed_seconds = 0;  // per step, communication left after backward finished
};

StepResult run_training(int64_t batch, int64_t img, int64_t warmup, int64_t steps, int seed) {
  manual_seed(0);
  auto model = models::mobilenet_v3_small(1000);
  model->train();
  dist::DataParallel dp(model);
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 4e-5});
  const auto [x, y] = bench::random_batch(batch, img, 1000, static_cast<uint64_t>(seed));
  StepResult r;
  auto step = [&] {
    opt.zero_grad();
    cross_entropy(dp.forward(x), y).backward();
    opt.step();
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  dist::barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    step();
    const auto stats = dp.last_comm_stats();
    r.comm_seconds += stats.comm_seconds;
    r.exposed_seconds += stats.exposed_seconds;
  }
  // The job's speed is the slowest rank's.
  Tensor elapsed = Tensor::from_vector(std::vector<float>{static_cast<float>(bench::seconds_since(t0))}, {1});
  if (dist::get_world_size() > 1) dist::default_group().allreduce({elapsed}, dist::ReduceOp::Max)->wait();
  r.seconds_per_step = elapsed.item() / static_cast<double>(steps);
  r.comm_seconds /= static_cast<double>(steps);
  r.exposed_seconds /= static_cast<double>(steps);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("bench_ddp", [&] {
    Flags flags("bench_ddp", "MobileNetV3-small data-parallel training: dpar vs PyTorch DDP");
    auto& world = flags.add_int("world", 2, "ranks");
    auto& batch = flags.add_int("batch", 16, "images per rank per step");
    auto& img = flags.add_int("img", 224, "image side");
    auto& warmup = flags.add_int("warmup", 2, "untimed steps");
    auto& steps = flags.add_int("steps", 5, "timed steps");
    auto& peer = flags.add_bool("peer", true, "also run the PyTorch DDP peer");
    auto& worker = flags.add_bool("worker", false, "internal: run as one rank under dpar-launch");
    auto& result = flags.add_string("result", "", "internal: where rank 0 writes its figures");
    auto& launcher = flags.add_string("launcher", DPAR_LAUNCHER, "dpar-launch binary");
    auto& port = flags.add_int("start-port", 29300, "dpar-launch --start_port");
    flags.parse(argc, argv);
    set_num_threads(1);

    if (worker) {
      dist::init_parallel_env();
      const StepResult r = run_training(batch, img, warmup, steps, dist::get_rank() + 1);
      if (dist::get_rank() == 0) {
        std::ofstream(result) << r.seconds_per_step << " " << r.comm_seconds << " " << r.exposed_seconds << "\n";
      }
      dist::destroy();
      return 0;
    }

    // 1. One process alone (the scaling baseline).
    const StepResult single = run_training(batch, img, warmup, steps, 1);
    const double single_ips = static_cast<double>(batch) / single.seconds_per_step;

    // 2. world ranks under dpar-launch.
    const std::string result_file = "/tmp/bench_ddp_" + std::to_string(getpid()) + ".txt";
    const std::string cmd = launcher + " --nproc_per_node=" + std::to_string(world) +
                            " --start_port=" + std::to_string(port) + " --log_dir=/tmp/bench_ddp_log_" +
                            std::to_string(getpid()) + " " + std::string(argv[0]) + " --worker --result " +
                            result_file + " --batch " + std::to_string(batch) + " --img " + std::to_string(img) +
                            " --warmup " + std::to_string(warmup) + " --steps " + std::to_string(steps) +
                            " > /dev/null";
    const int status = std::system(cmd.c_str());
    DPAR_CHECK(status == 0, "bench_ddp: the ", world, "-rank run failed (status ", status, "): ", cmd);
    StepResult multi;
    std::ifstream(result_file) >> multi.seconds_per_step >> multi.comm_seconds >> multi.exposed_seconds;
    std::remove(result_file.c_str());
    const double multi_ips = static_cast<double>(world * batch) / multi.seconds_per_step;
    const double hidden = multi.comm_seconds > 0 ? 1.0 - multi.exposed_seconds / multi.comm_seconds : 0.0;

    std::printf("bench_ddp: mobilenet_v3_small %lldpx, %lld ranks x 1 thread, batch %lld per rank, %lld timed steps\n",
                static_cast<long long>(img), static_cast<long long>(world), static_cast<long long>(batch),
                static_cast<long long>(steps));
    std::printf("  dpar     %8.2f img/s with %lld ranks | one process %7.2f img/s | scaling efficiency %.3f\n",
                multi_ips, static_cast<long long>(world), single_ips, multi_ips / (static_cast<double>(world) * single_ips));
    std::printf("           communication per step %.1f ms, of which %.1f ms exposed after backward: %.0f%% hidden\n",
                multi.comm_seconds * 1e3, multi.exposed_seconds * 1e3, 100.0 * hidden);
    if (peer) {
      const auto p = bench::run_peer("torch_ddp.py",
                                     "--world " + std::to_string(world) + " --batch " + std::to_string(batch) +
                                         " --img " + std::to_string(img) + " --warmup " + std::to_string(warmup) +
                                         " --steps " + std::to_string(steps),
                                     1);
      const double theirs = p.at("img_per_s").get<double>();
      std::printf("  pytorch  %8.2f img/s with %lld ranks | one process %7.2f img/s | scaling efficiency %.3f (DDP, gloo)\n",
                  theirs, static_cast<long long>(world), p.at("single_img_per_s").get<double>(),
                  p.at("scaling").get<double>());
      std::printf("  ratio dpar/pytorch (%lld ranks): %.2fx\n", static_cast<long long>(world), multi_ips / theirs);
    }
    return 0;
  });
}
