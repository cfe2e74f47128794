#pragma once
// bench_ddp --shard: DataParallel with sharding (optimizer / gradients) against unsharded, in
// the same invocation: img/s of both in alternating rounds and their ratio, the memory a rank
// holds (parameters, gradients, optimizer state, allocator peak) at several world sizes, and
// the PyTorch peer (DDP + ZeroRedundancyOptimizer) in its best setting on the same loop. The
// sharded job also runs with overlap_gather = false, so the time the overlap of the all-gather
// with the next forward hides shows beside it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "dpar/distributed/data_parallel.h"

namespace dpar::bench {

// One collective job's figures, as rank 0 writes them for the driver.
struct StepResult {
  double seconds_per_step = 0;
  double comm_seconds = 0;         // per step, all-reduce time summed over buckets
  double exposed_seconds = 0;      // per step, communication left after backward finished
  double gather_wait_seconds = 0;  // per step, waiting for the sharded all-gather
  double cpu_seconds = 0;          // per step, CPU time of every thread of this process
  size_t parameter_bytes = 0;      // DataParallel::memory_stats() after the timed steps
  size_t gradient_bytes = 0;
  size_t optimizer_state_bytes = 0;
  size_t peak_bytes = 0;  // the allocator's peak during the timed steps
};

void write_step_result(const std::string& path, const StepResult& r);
StepResult read_step_result(const std::string& path);  // throws naming path

struct ShardBench {
  std::string model, opt;
  dist::ShardMode shard = dist::ShardMode::none;
  int64_t world = 2, threads = 1, batch = 16, img = 224, warmup = 2, steps = 5, rounds = 3;
  std::string memory_worlds;  // "1,2,4"
  bool peer = true;
  std::string peer_bind_args;  // " --cpu-shares ..." for torch_ddp.py, or empty (unbound)
  // Runs a collective job: (ranks, shard, overlap_gather, warmup, steps) -> rank 0's figures.
  std::function<StepResult(int64_t, dist::ShardMode, bool, int64_t, int64_t)> run;
};

// Prints the comparison and its JSON line; returns the exit code.
int run_shard_bench(const ShardBench& bench);

}  // namespace dpar::bench
