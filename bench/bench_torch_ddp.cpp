// libtorch data-parallel training throughput, 2 ranks x 1 thread (--world, --threads), through
// dpar::torch::DataParallel beside PyTorch's Python DDP (gloo) on the same graph, batch and
// optimizer (bench/peers/torch_ddp.py), in the same invocation. --model:
//   resnet18            the ResNet-18 of examples/libtorch (torch::nn; Fashion-MNIST-shaped
//                       [batch, 1, 32, 32] random inputs, 10 classes; batch 32), against
//                       torchvision's ResNet-18 with the same 1-channel stem
//   mobilenet_v3_small  torchvision's MobileNetV3-small written with torch::nn
//                       (examples/libtorch/mobilenet_v3.h; [batch, 3, 224, 224], 1000 classes;
//                       batch 16, as bench_ddp), against torchvision's own Reports images/s of
//                       both, their ratio, the share of
// dpar's communication hidden behind backward, and each one's scaling against the same program
// without DataParallel in one process (the overhead of going data parallel).
//
// --shard optimizer|gradients runs dpar::torch::DataParallel sharded (ZeRO-1/2, the SGD built by
// ddp.make_optimizer over this rank's slices) against DDP with ZeroRedundancyOptimizer.
//
// Rounds (--rounds) alternate the order of (single process, dpar job, PyTorch job); the figures
// are medians of each round's values, since the speed of a shared machine drifts within minutes.
// Run without arguments; --worker (one rank under dpar-launch) is internal.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>

#include "bench_util.h"
#include "dpar/core/flags.h"
#include "dpar/torch.h"
#include "libtorch/mobilenet_v3.h"
#include "libtorch/resnet18.h"

namespace {

struct StepResult {
  double seconds_per_step = 0;
  double comm_seconds = 0, exposed_seconds = 0;  // per step (DataParallel's statistics)
};

struct Shape {
  int64_t channels, classes;
};

template <typename Net>
StepResult run_training(Shape shape, int64_t batch, int64_t img, int64_t warmup, int64_t steps,
                        bool ddp_on, int seed, dpar::dist::ShardMode shard) {
  torch::manual_seed(0);
  Net model(shape.classes);
  model->train();
  const auto sgd = torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(4e-5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  const at::Tensor x = at::randn({batch, shape.channels, img, img}, gen);
  const at::Tensor y = at::randint(0, shape.classes, {batch}, gen);
  std::unique_ptr<dpar::torch::DataParallel<Net>> ddp;
  std::shared_ptr<torch::optim::Optimizer> opt;
  if (ddp_on) {
    dpar::torch::DataParallelOptions options;
    options.shard = shard;
    ddp = std::make_unique<dpar::torch::DataParallel<Net>>(model, options);
    opt = ddp->template make_optimizer<torch::optim::SGD>(sgd);  // sharded: over the slices
  } else {
    opt = std::make_shared<torch::optim::SGD>(model->parameters(), sgd);
  }
  StepResult r;
  auto step = [&] {
    opt->zero_grad();
    const at::Tensor out = ddp ? ddp->forward(x) : model->forward(x);
    torch::nn::functional::cross_entropy(out, y).backward();
    opt->step();
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  if (ddp_on) dpar::torch::barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    step();
    if (ddp) {
      r.comm_seconds += ddp->last_comm_stats().comm_seconds;
      r.exposed_seconds += ddp->last_comm_stats().exposed_seconds;
    }
  }
  // The job's speed is the slowest rank's.
  at::Tensor elapsed = torch::tensor({static_cast<float>(dpar::bench::seconds_since(t0))});
  if (ddp_on) dpar::torch::all_reduce(elapsed, dpar::dist::ReduceOp::Max);
  r.seconds_per_step = elapsed.item<double>() / static_cast<double>(steps);
  r.comm_seconds /= static_cast<double>(steps);
  r.exposed_seconds /= static_cast<double>(steps);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  return dpar::run_main("bench_torch_ddp", [&] {
    dpar::Flags flags("bench_torch_ddp",
                      "libtorch ResNet-18: dpar::torch::DataParallel vs PyTorch DDP (gloo)");
    auto& world = flags.add_int("world", 2, "ranks");
    auto& threads = flags.add_int("threads", 1, "intra-op threads per rank (and per process)");
    auto& model = flags.add_string("model", "resnet18", "resnet18 or mobilenet_v3_small");
    auto& batch_flag =
        flags.add_int("batch", 0, "images per rank per step (0: 32 for resnet18, 16 otherwise)");
    auto& img_flag = flags.add_int("img", 0, "image side (0: 32 for resnet18, 224 otherwise)");
    auto& warmup = flags.add_int("warmup", 3, "untimed steps");
    auto& steps = flags.add_int("steps", 10, "timed steps");
    auto& rounds = flags.add_int("rounds", 3, "rounds of (single, dpar job, PyTorch job)");
    auto& peer = flags.add_bool("peer", true, "also run PyTorch DDP");
    auto& shard_flag = flags.add_string(
        "shard", "none",
        "none, optimizer or gradients (the peer then runs ZeroRedundancyOptimizer)");
    auto& worker = flags.add_bool("worker", false, "internal: one rank under dpar-launch");
    auto& result = flags.add_string("result", "", "internal: where rank 0 writes its figures");
    auto& launcher = flags.add_string("launcher", DPAR_LAUNCHER, "dpar-launch binary");
    auto& port = flags.add_int("start-port", 29400, "dpar-launch --start_port");
    flags.parse(argc, argv);
    DPAR_CHECK(rounds >= 1 && threads >= 1 && world >= 1,
               "bench_torch_ddp: --rounds, --threads and --world must be >= 1");
    DPAR_CHECK(model == "resnet18" || model == "mobilenet_v3_small",
               "bench_torch_ddp: --model=", model, ": expected resnet18 or mobilenet_v3_small");
    const bool resnet = model == "resnet18";
    const int64_t batch = batch_flag > 0 ? batch_flag : resnet ? 32 : 16;
    const int64_t img = img_flag > 0 ? img_flag : resnet ? 32 : 224;
    const Shape shape = resnet ? Shape{1, 10} : Shape{3, 1000};
    const dpar::dist::ShardMode shard = dpar::dist::parse_shard_mode(shard_flag);
    const bool sharded = shard != dpar::dist::ShardMode::none;
    auto train = [&](bool ddp_on, int seed) {
      return resnet ? run_training<libtorch_example::ResNet18>(shape, batch, img, warmup, steps,
                                                               ddp_on, seed, shard)
                    : run_training<libtorch_example::MobileNetV3Small>(shape, batch, img, warmup,
                                                                       steps, ddp_on, seed, shard);
    };
    auto count = [](const torch::nn::Module& m) {
      int64_t n = 0;
      for (const auto& p : m.parameters()) n += p.numel();
      return n;
    };
    const int64_t parameter_count = resnet
                                        ? count(*libtorch_example::ResNet18(shape.classes))
                                        : count(*libtorch_example::MobileNetV3Small(shape.classes));
    at::set_num_threads(static_cast<int>(threads));
    at::set_num_interop_threads(1);

    if (worker) {
      dpar::dist::init_parallel_env();
      const StepResult r = train(true, dpar::dist::get_rank());
      if (dpar::dist::get_rank() == 0) {
        std::ofstream(result) << r.seconds_per_step << " " << r.comm_seconds << " "
                              << r.exposed_seconds << "\n";
      }
      dpar::dist::destroy();
      return 0;
    }

    const std::string result_file = "/tmp/bench_torch_ddp_" + std::to_string(getpid()) + ".txt";
    auto run_dpar_job = [&] {
      const std::string cmd =
          launcher + " --nproc_per_node=" + std::to_string(world) +
          " --start_port=" + std::to_string(port) + " --log_dir=/tmp/bench_torch_ddp_log_" +
          std::to_string(getpid()) + " " + dpar::bench::self_path() + " --worker --result " +
          result_file + " --model " + std::string(model) + " --batch " + std::to_string(batch) +
          " --img " + std::to_string(img) + " --warmup " + std::to_string(warmup) + " --steps " +
          std::to_string(steps) + " --threads " + std::to_string(threads) + " --shard " +
          std::string(shard_flag) + " > /dev/null";
      const int status = std::system(cmd.c_str());
      DPAR_CHECK(status == 0, "bench_torch_ddp: the dpar job failed (status ", status, "): ", cmd);
      StepResult r;
      std::ifstream(result_file) >> r.seconds_per_step >> r.comm_seconds >> r.exposed_seconds;
      std::remove(result_file.c_str());
      return r;
    };
    auto run_torch_job = [&] {
      return dpar::bench::run_peer(
          "torch_ddp.py",
          "--model " + std::string(model) + " --world " + std::to_string(world) + " --batch " +
              std::to_string(batch) + " --img " + std::to_string(img) + " --warmup " +
              std::to_string(warmup) + " --steps " + std::to_string(steps) + " --threads " +
              std::to_string(threads) + (sharded ? " --zero" : ""),
          static_cast<int>(threads));
    };
    const double images_per_step = static_cast<double>(world * batch);
    std::vector<double> single_ips, dpar_ips, dpar_scaling, hidden, torch_ips, torch_single,
        torch_scaling, ratio;
    for (int64_t round = 0; round < rounds; ++round) {
      StepResult single, job;
      nlohmann::json theirs;
      auto do_single = [&] { single = train(false, 0); };
      auto do_job = [&] { job = run_dpar_job(); };
      auto do_torch = [&] {
        if (peer) theirs = run_torch_job();
      };
      if (round % 2 == 0) {
        do_single(), do_job(), do_torch();
      } else {
        do_torch(), do_job(), do_single();
      }
      single_ips.push_back(static_cast<double>(batch) / single.seconds_per_step);
      dpar_ips.push_back(images_per_step / job.seconds_per_step);
      dpar_scaling.push_back(dpar_ips.back() / (static_cast<double>(world) * single_ips.back()));
      hidden.push_back(job.comm_seconds > 0 ? 1.0 - job.exposed_seconds / job.comm_seconds : 1.0);
      std::printf(
          "  round %lld: single %.1f img/s, dpar %lld ranks %.1f img/s (comm %.1f ms/step, "
          "%.1f ms exposed)",
          static_cast<long long>(round + 1), single_ips.back(), static_cast<long long>(world),
          dpar_ips.back(), job.comm_seconds * 1e3, job.exposed_seconds * 1e3);
      if (peer) {
        // The same graph on both sides, as far as the parameters tell.
        DPAR_CHECK(theirs.at("params").get<int64_t>() == parameter_count,
                   "bench_torch_ddp: ", std::string(model), " has ", parameter_count,
                   " parameters here but ", theirs.at("params").get<int64_t>(),
                   " in torchvision's");
        torch_ips.push_back(theirs.at("img_per_s").get<double>());
        torch_single.push_back(theirs.at("single_img_per_s").get<double>());
        torch_scaling.push_back(theirs.at("scaling").get<double>());
        ratio.push_back(dpar_ips.back() / torch_ips.back());
        std::printf(", PyTorch DDP %.1f img/s (single %.1f)", torch_ips.back(),
                    torch_single.back());
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    using dpar::bench::median;
    std::printf(
        "bench_torch_ddp: %s (libtorch, %lldx%lld, %lld channel(s)), batch %lld per rank, %lld "
        "ranks x %lld thread(s), medians of %lld rounds (load %s)\n",
        std::string(model).c_str(), static_cast<long long>(img), static_cast<long long>(img),
        static_cast<long long>(shape.channels), static_cast<long long>(batch),
        static_cast<long long>(world), static_cast<long long>(threads),
        static_cast<long long>(rounds), dpar::bench::load_average().c_str());
    std::printf(
        "  dpar::torch::DataParallel %8.1f img/s  scaling %.2f vs one process without "
        "DataParallel (%.1f img/s); %.0f%% of communication hidden behind backward; shard %s\n",
        median(dpar_ips), median(dpar_scaling), median(single_ips), 100.0 * median(hidden),
        dpar::dist::shard_mode_name(shard));
    nlohmann::json json = {{"bench", "bench_torch_ddp"},
                           {"model", std::string(model)},
                           {"img", img},
                           {"batch", batch},
                           {"ranks", world},
                           {"threads", threads},
                           {"dpar_img_per_s", median(dpar_ips)},
                           {"dpar_scaling", median(dpar_scaling)},
                           {"hidden_share", median(hidden)},
                           {"shard", dpar::dist::shard_mode_name(shard)}};
    if (peer) {
      std::printf(
          "  PyTorch DDP (gloo)%s %8.1f img/s  scaling %.2f vs its one process (%.1f img/s)\n",
          sharded ? " + ZeroRedundancyOptimizer" : "       ", median(torch_ips),
          median(torch_scaling), median(torch_single));
      std::printf("  ratio dpar/PyTorch: %.2fx (median of the rounds' ratios; target >= 1.0)\n",
                  median(ratio));
      json["torch_img_per_s"] = median(torch_ips);
      json["ratio"] = median(ratio);
    }
    std::printf("%s\n", json.dump().c_str());
    return 0;
  });
}
