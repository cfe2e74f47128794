#pragma once
// bench_allreduce --device gpu (bench_allreduce_nccl.cpp; CUDA builds only).
#include <cstdint>

namespace dpar::bench {

struct GpuAllreduceOptions {
  double max_mb = 256;
  int64_t reps = 5;
  int gpu_index = 0;  // every rank on this GPU; -1: the launcher's DPAR_DEVICE
  bool peer = true;   // also run torch.distributed (bench/peers/torch_allreduce_gpu.py)
  // Calls per timed loop: 64 MB / size, at least 5 and at most this. Small messages over the
  // socket transport of ranks sharing one GPU take ~100 us, so 65536 calls of 1 KB would take
  // minutes (seen on the H100); the peer runs the same loops.
  int64_t max_iters = 2000;
};

// One rank's part (under dpar-launch); rank 0 prints the table.
int run_gpu_allreduce_worker(const GpuAllreduceOptions& options);

}  // namespace dpar::bench
