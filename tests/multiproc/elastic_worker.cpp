// Run under dpar-launch --nnodes=MIN:MAX: an elastic DataParallel job (dist::ElasticJob) that
// trains a small MLP on an embedded synthetic dataset for --steps steps. The sampler re-shards
// the rest of each epoch over whatever world a round has (EpochRemainderSampler from the
// committed position), and the batch follows dist::plan_step: --policy=rank keeps the per-rank
// batch (the global batch and the LR scale with the world), --policy=global keeps the global
// batch through gradient accumulation under no_sync. --trace=FILE appends the samples of every
// committed step (and, from round 0's rank 0, the epoch's order), so a test can check that no
// sample is skipped or seen twice.
// Drills, each for the member that is rank --drill-rank of round 0 (a world of 3), at step
// --drill-step:
//   --kill   SIGKILLs itself as the step starts (a node that died),
//   --stop   SIGSTOPs itself as the step starts (a wedged or cut-off node),
//   --hold   writes <--trace>.held and waits as the step starts, for the test to kill or cut
//            off its whole node (network-namespace drills: the launcher, an etcd member),
//   --leave  leaves on purpose after committing the step before (the planned-schedule
//            reference: the same membership change without a failure).
// With --trace, <--trace>.ready appears as the process is about to join the job's first round.
// And --kill-connecting: the member SIGKILLs itself as soon as round 0 has formed with it as
// rank --drill-rank of 3, before the round's group connects (the others are connecting to it);
// --stop-joining: a restarted process (DPAR_RESTART_COUNT >= 1) SIGSTOPs itself as soon as the
// round it joins has formed, before it receives the committed state.
// Every member that finishes prints "elastic_worker: finished" with the step, the world, the
// state's checksum and the rounds it went through, which the tests compare across runs.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/elastic.h"
#include "dpar/dpar.h"

using namespace dpar;
using namespace dpar::dist;

namespace {

constexpr size_t kSamples = 120;
constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;
constexpr int kFullWorld = 3;

// Sample i of the embedded dataset: features from a generator seeded by i, the class from a
// fixed rule over them, so every process holds the same data without files.
std::pair<std::vector<float>, int64_t> sample(size_t i) {
  Generator g(9000 + i);
  std::vector<float> x(kFeatures);
  for (float& v : x) v = g.normal();
  const int64_t y = (x[0] + x[1] > 0 ? 1 : 0) + (x[2] - x[3] > 0 ? 2 : 0);
  return {x, y};
}

std::pair<Tensor, Tensor> batch(const std::vector<size_t>& indices) {
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (size_t i : indices) {
    auto [x, y] = sample(i);
    xs.insert(xs.end(), x.begin(), x.end());
    ys.push_back(y);
  }
  const auto n = static_cast<int64_t>(indices.size());
  return {Tensor::from_vector(xs, {n, kFeatures}), Tensor::from_vector(ys, {n})};
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("elastic_worker", [&] {
    Flags flags("elastic_worker", "an elastic DataParallel job and its failure drills");
    auto& steps = flags.add_int("steps", 12, "training steps (global)");
    auto& per_rank_batch = flags.add_int("batch", 4, "samples per rank and step");
    auto& step_ms =
        flags.add_int("step-ms", 0, "extra milliseconds each step takes (a slower job)");
    auto& kill = flags.add_bool("kill", false, "drill: SIGKILL at --drill-step");
    auto& stop = flags.add_bool("stop", false, "drill: SIGSTOP at --drill-step");
    auto& hold = flags.add_bool("hold", false,
                                "drill: at --drill-step write <--trace>.held and wait for the "
                                "test to strike the node");
    auto& leave = flags.add_bool("leave", false, "drill: leave after step --drill-step - 1");
    auto& kill_connecting = flags.add_bool(
        "kill-connecting", false, "drill: SIGKILL once round 0 formed, before its group connects");
    auto& stop_joining = flags.add_bool(
        "stop-joining", false,
        "drill: a restarted process SIGSTOPs once its first round formed, before the state comes");
    auto& drill_rank = flags.add_int("drill-rank", 2, "the drill's rank (in a world of 3)");
    auto& drill_step = flags.add_int("drill-step", 5, "the drill's step");
    auto& policy_flag =
        flags.add_string("policy", "rank", "rank (keep the per-rank batch) or global");
    auto& trace = flags.add_string("trace", "", "append the committed steps' samples to this file");
    auto& init_seed = flags.add_int("init-seed", -1,
                                    "seed of this process's initial weights (default: from its "
                                    "pid); the first round hands rank 0's to every member");
    flags.parse(argc, argv, /*allow_positional=*/true);
    set_num_threads(1);
    if (policy_flag != "rank" && policy_flag != "global") {
      throw FlagError("elastic_worker: --policy=" + policy_flag + ": expected rank or global");
    }
    const BatchPolicy policy =
        policy_flag == "rank" ? BatchPolicy::KeepPerRankBatch : BatchPolicy::KeepGlobalBatch;
    std::FILE* trace_file = trace.empty() ? nullptr : std::fopen(trace.c_str(), "a");

    manual_seed(static_cast<uint64_t>(init_seed >= 0 ? init_seed : 1234 + ::getpid()));
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(kFeatures, 32));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(32, kClasses));
    const double base_lr = 0.05;
    optim::SGD optimizer(model->parameters(), {.lr = base_lr, .momentum = 0.9});
    int64_t step = 0, epoch = 0, consumed = 0;

    ElasticState state;
    state.add_module("model", *model);
    state.add_optimizer("optimizer", optimizer);
    state.add_counter("step", step);
    state.add_counter("epoch", epoch);
    state.add_counter("consumed", consumed);  // samples of the epoch the job has trained on

    ElasticOptions options = ElasticOptions::from_env();
    const std::string doomed =
        "round 0: rank " + std::to_string(drill_rank) + " of " + std::to_string(kFullWorld) + " ";
    const char* restarts = std::getenv("DPAR_RESTART_COUNT");
    const bool restarted = restarts != nullptr && std::string(restarts) != "0";
    options.log = [&](const std::string& line) {
      std::fprintf(stderr, "dpar: %s\n", line.c_str());
      // The job logs a round's line as it forms, before the round's group connects and the
      // state is synced.
      if (kill_connecting && line.rfind("elastic: " + doomed, 0) == 0) {
        std::printf("elastic_worker: killed while round 0 connects\n");
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      if (stop_joining && restarted && line.rfind("elastic: round ", 0) == 0) {
        std::printf("elastic_worker: stopped as it joins\n");
        std::fflush(stdout);
        std::raise(SIGSTOP);
      }
    };
    ElasticJob job(options);
    if (!trace.empty()) {
      // Tells the test this process is about to join round 0, so it can start the next node
      // only then: arrival order decides round 0's ranks, and process start-up times vary.
      if (FILE* ready = std::fopen((trace + ".ready").c_str(), "w")) std::fclose(ready);
    }
    auto last_commit = std::chrono::steady_clock::now();
    job.run(state, [&](Group& group) {
      const int rank = group.rank(), world = group.size();
      std::printf(
          "elastic_worker: round %lld: rank %d of %d at step %lld (%.1f s after the last "
          "commit)\n",
          static_cast<long long>(job.round()), rank, world, static_cast<long long>(step),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - last_commit).count());
      std::fflush(stdout);
      const StepPlan plan = plan_step(policy, per_rank_batch, kFullWorld, world);
      const auto per_step = static_cast<size_t>(plan.micro_batch * plan.accumulation);
      optimizer.set_lr(base_lr * plan.lr_scale);
      DataParallelOptions options;
      options.group = job.group_ptr();
      DataParallel dp(model, options);
      if (trace_file != nullptr && job.round() == 0 && rank == 0) {
        std::fprintf(trace_file, "order");
        for (size_t i : data::DistributedSampler(kSamples, 0, 1, true, 7).epoch_order(0)) {
          std::fprintf(trace_file, " %zu", i);
        }
        std::fprintf(trace_file, "\n");
      }
      while (step < steps) {
        auto order = std::make_shared<data::DistributedSampler>(kSamples, rank, world, true, 7);
        const std::vector<size_t> rest =
            data::EpochRemainderSampler(order, epoch, consumed).indices(epoch);
        if (rest.size() < per_step) {  // drop_last: the next epoch
          ++epoch;
          consumed = 0;
          continue;
        }
        // Only in the first round: a restarted process that rejoins is not struck again.
        const bool drilled =
            job.round() == 0 && world == kFullWorld && rank == drill_rank && step == drill_step;
        if (drilled && kill) std::raise(SIGKILL);
        if (drilled && stop) std::raise(SIGSTOP);
        if (drilled && hold) {
          if (FILE* held = std::fopen((trace + ".held").c_str(), "w")) std::fclose(held);
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        optimizer.zero_grad();
        for (int64_t m = 0; m < plan.accumulation; ++m) {
          const auto first = rest.begin() + m * plan.micro_batch;
          auto [x, y] = batch(std::vector<size_t>(first, first + plan.micro_batch));
          // The mean over this rank's whole step; only the last micro-batch all-reduces.
          auto backward = [&] {
            (cross_entropy(dp.forward(x), y) * (1.0 / static_cast<double>(plan.accumulation)))
                .backward();
          };
          if (m + 1 < plan.accumulation) {
            auto guard = dp.no_sync();
            backward();
          } else {
            backward();
          }
        }
        optimizer.step();
        if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
        consumed += static_cast<int64_t>(per_step) * world;
        ++step;
        if (trace_file != nullptr) {  // the step counts once its commit is taken (just below)
          std::fprintf(trace_file, "step %lld", static_cast<long long>(step));
          for (size_t i = 0; i < per_step; ++i) std::fprintf(trace_file, " %zu", rest[i]);
          std::fprintf(trace_file, "\n");
          std::fflush(trace_file);
        }
        job.commit();
        last_commit = std::chrono::steady_clock::now();
        if (leave && job.round() == 0 && rank == drill_rank && step == drill_step) job.leave();
      }
    });
    if (step < steps) {
      std::printf("elastic_worker: left at step %lld\n", static_cast<long long>(step));
      return 0;
    }
    state.commit();
    std::printf("elastic_worker: finished step=%lld world=%d checksum=%016llx rounds=%zu\n",
                static_cast<long long>(step), job.world_size(),
                static_cast<unsigned long long>(state.checksum()), job.history().size());
    return 0;
  });
}
