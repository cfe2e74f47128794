#include "bench_ddp_shard.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "bench_util.h"

namespace dpar::bench {
namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::vector<int64_t> parse_worlds(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long long n = std::strtoll(item.c_str(), &end, 10);
    DPAR_CHECK(!item.empty() && *end == '\0' && n >= 1 && n <= 64,
               "bench_ddp: --memory-worlds must list world sizes like 1,2,4; got '", text, "'");
    out.push_back(n);
  }
  return out;
}

}  // namespace

void write_step_result(const std::string& path, const StepResult& r) {
  std::ofstream(path) << r.seconds_per_step << " " << r.comm_seconds << " " << r.exposed_seconds
                      << " " << r.gather_wait_seconds << " " << r.cpu_seconds << " "
                      << r.parameter_bytes << " " << r.gradient_bytes << " "
                      << r.optimizer_state_bytes << " " << r.peak_bytes << "\n";
}

StepResult read_step_result(const std::string& path) {
  StepResult r;
  std::ifstream in(path);
  DPAR_CHECK(static_cast<bool>(in >> r.seconds_per_step >> r.comm_seconds >> r.exposed_seconds >>
                               r.gather_wait_seconds >> r.cpu_seconds >> r.parameter_bytes >>
                               r.gradient_bytes >> r.optimizer_state_bytes >> r.peak_bytes) &&
                 r.seconds_per_step > 0,
             "bench_ddp: the job left no result in ", path);
  return r;
}

int run_shard_bench(const ShardBench& b) {
  const char* mode = dist::shard_mode_name(b.shard);
  auto images_per_s = [&](const StepResult& r) {
    return static_cast<double>(b.world * b.batch) / r.seconds_per_step;
  };
  // Throughput: unsharded, sharded, and sharded with the gather inside step() alternate
  // (ABC CBA), so drift lands on all three.
  std::vector<double> none_ips, shard_ips, sync_ips, ratio, sync_ratio, wait_ms, sync_wait_ms;
  for (int64_t round = 0; round < b.rounds; ++round) {
    StepResult none, sharded, sync;
    auto run_none = [&] { none = b.run(b.world, dist::ShardMode::none, true, b.warmup, b.steps); };
    auto run_sharded = [&] { sharded = b.run(b.world, b.shard, true, b.warmup, b.steps); };
    auto run_sync = [&] { sync = b.run(b.world, b.shard, false, b.warmup, b.steps); };
    if (round % 2 == 0) {
      run_none(), run_sharded(), run_sync();
    } else {
      run_sync(), run_sharded(), run_none();
    }
    none_ips.push_back(images_per_s(none));
    shard_ips.push_back(images_per_s(sharded));
    sync_ips.push_back(images_per_s(sync));
    ratio.push_back(shard_ips.back() / none_ips.back());
    sync_ratio.push_back(sync_ips.back() / none_ips.back());
    wait_ms.push_back(sharded.gather_wait_seconds * 1e3);
    sync_wait_ms.push_back(sync.gather_wait_seconds * 1e3);
  }
  std::printf(
      "bench_ddp --shard %s: %s %lldpx, %s, %lld ranks x %lld thread(s) on cpu, batch %lld per "
      "rank, %lld timed steps, %lld rounds (medians)\n",
      mode, b.model.c_str(), static_cast<long long>(b.img), b.opt.c_str(),
      static_cast<long long>(b.world), static_cast<long long>(b.threads),
      static_cast<long long>(b.batch), static_cast<long long>(b.steps),
      static_cast<long long>(b.rounds));
  std::printf("  shard none      %8.2f img/s\n", median(none_ips));
  std::printf("  shard %-9s %8.2f img/s  ratio %s/none %.3f [", mode, median(shard_ips), mode,
              median(ratio));
  for (size_t i = 0; i < ratio.size(); ++i) std::printf("%s%.3f", i ? " " : "", ratio[i]);
  std::printf("] (target >= 0.95); all-gather waited for %.1f ms/step\n", median(wait_ms));
  std::printf(
      "  the same, gather inside step() (overlap_gather = false) %8.2f img/s  ratio %.3f; "
      "all-gather waited for %.1f ms/step\n",
      median(sync_ips), median(sync_ratio), median(sync_wait_ms));

  // Memory per rank (rank 0's) at each world size: a short job each.
  std::printf(
      "  memory per rank, MiB (rank 0; gradients and optimizer state after the last step, "
      "allocator peak over the timed steps):\n"
      "    ranks  shard      parameters  gradients  optimizer state  peak\n");
  nlohmann::json memory = nlohmann::json::array();
  std::vector<dist::ShardMode> modes{dist::ShardMode::none};
  if (b.shard != dist::ShardMode::none) modes.push_back(b.shard);
  for (int64_t n : parse_worlds(b.memory_worlds)) {
    for (dist::ShardMode m : modes) {
      const StepResult r = b.run(n, m, true, 1, 2);
      std::printf("    %5lld  %-9s  %10.2f  %9.2f  %15.2f  %6.2f\n", static_cast<long long>(n),
                  dist::shard_mode_name(m), mib(r.parameter_bytes), mib(r.gradient_bytes),
                  mib(r.optimizer_state_bytes), mib(r.peak_bytes));
      memory.push_back({{"ranks", n},
                        {"shard", dist::shard_mode_name(m)},
                        {"parameters_mib", mib(r.parameter_bytes)},
                        {"gradients_mib", mib(r.gradient_bytes)},
                        {"optimizer_state_mib", mib(r.optimizer_state_bytes)},
                        {"peak_mib", mib(r.peak_bytes)}});
    }
  }
  nlohmann::json json = {{"bench", "bench_ddp_shard"},
                         {"model", b.model},
                         {"opt", b.opt},
                         {"shard", mode},
                         {"ranks", b.world},
                         {"none_img_per_s", median(none_ips)},
                         {"shard_img_per_s", median(shard_ips)},
                         {"ratio_shard_none", median(ratio)},
                         {"sync_gather_img_per_s", median(sync_ips)},
                         {"gather_wait_ms", median(wait_ms)},
                         {"sync_gather_wait_ms", median(sync_wait_ms)},
                         {"memory", memory}};
  if (b.peer) {
    // PyTorch's sharded optimizer state: DDP + ZeroRedundancyOptimizer (ZeRO-1; torch has no
    // ZeRO-2 without FSDP, which does not run on gloo CPU), same model, optimizer and batch;
    // and plain DDP, so the cost of its sharding shows beside dpar's. Both channels-last, its
    // fastest setting for these convolutional networks.
    auto peer_ips = [&](const std::string& extra) {
      return run_peer("torch_ddp.py",
                      "--world " + std::to_string(b.world) + " --batch " + std::to_string(b.batch) +
                          " --img " + std::to_string(b.img) + " --warmup " +
                          std::to_string(b.warmup) + " --steps " + std::to_string(b.steps) +
                          " --threads " + std::to_string(b.threads) + " --model " + b.model +
                          " --opt " + b.opt + " --channels-last" + b.peer_bind_args + extra,
                      static_cast<int>(b.threads))
          .at("img_per_s")
          .get<double>();
    };
    const double zero = peer_ips(" --zero"), ddp = peer_ips("");
    std::printf(
        "  pytorch   %8.2f img/s DDP + ZeroRedundancyOptimizer (plain DDP %.2f img/s: ratio "
        "%.3f), gloo, channels-last\n",
        zero, ddp, zero / ddp);
    std::printf("  ratio dpar shard %s / pytorch ZeRO: %.2fx\n", mode, median(shard_ips) / zero);
    json["pytorch_zero_img_per_s"] = zero;
    json["pytorch_ddp_img_per_s"] = ddp;
    json["ratio_dpar_pytorch"] = median(shard_ips) / zero;
  }
  std::printf("%s\n", json.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace dpar::bench
