// bench_allreduce --device gpu: dpar's NCCL group beside a raw ncclAllReduce loop on a second
// communicator of the same ranks, and (rank 0, afterwards) torch.distributed's NCCL all-reduce
// (bench/peers/torch_allreduce_gpu.py), at 1 KB .. 256 MB of f32.
//
// Every rank uses GPU --gpu-index. On the one-GPU machine the ranks share that GPU: NCCL
// refuses two ranks on one device of one host, so each rank takes its own NCCL_HOSTID and the
// ranks talk over NCCL's socket transport on lo (the driver sets NCCL_SOCKET_IFNAME=lo and
// turns P2P/SHM off unless the caller set them). With one GPU per rank (several GPUs), pass
// --gpu-index -1 to use the launcher's DPAR_DEVICE and keep NCCL's own transports.
//
// Both sides enqueue `iters` all-reduces back to back and synchronise once: per-call time is
// the stream throughput, and at small sizes the difference is dpar's per-call overhead (event
// record/wait, record_stream, Work). Bus bandwidth = 2(n-1)/n x size / time, as nccl-tests.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_allreduce_gpu.h"
#include "bench_util.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"

namespace dpar::bench {
namespace {

void cuda_ok(cudaError_t status, const char* what) {
  DPAR_CHECK(status == cudaSuccess, "bench_allreduce: ", what, ": ", cudaGetErrorString(status));
}
void nccl_ok(ncclResult_t result, const char* what) {
  DPAR_CHECK(result == ncclSuccess, "bench_allreduce: ", what, ": ", ncclGetErrorString(result));
}

// The raw peer: its own communicator and stream, id through the job's store.
class RawNccl {
 public:
  RawNccl(dist::Store& store, int rank, int world, int device) {
    ncclUniqueId id;
    if (rank == 0) {
      nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* b = reinterpret_cast<const uint8_t*>(&id);
      store.set("bench_allreduce/raw_nccl_id", dist::Bytes(b, b + sizeof(id)));
    } else {
      const dist::Bytes b = store.get("bench_allreduce/raw_nccl_id");
      DPAR_CHECK(b.size() == sizeof(id), "bench_allreduce: bad raw NCCL id");
      std::memcpy(&id, b.data(), sizeof(id));
    }
    cuda_ok(cudaSetDevice(device), "cudaSetDevice");
    nccl_ok(ncclCommInitRank(&comm_, world, id, rank), "ncclCommInitRank");
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~RawNccl() {
    (void)ncclCommDestroy(comm_);
    (void)cudaStreamDestroy(stream_);
  }
  void allreduce(float* data, size_t n) {
    nccl_ok(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void sync() { cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

int run_gpu_allreduce_worker(const GpuAllreduceOptions& opt) {
  dist::init_parallel_env();
  const int rank = dist::get_rank(), world = dist::get_world_size();
  DPAR_CHECK(world >= 2, "bench_allreduce --device gpu: needs at least 2 ranks, got ", world);
  const std::string assigned = dist::parallel_env().device;
  const Device device = opt.gpu_index >= 0               ? Device::cuda(opt.gpu_index)
                        : assigned.rfind("gpu:", 0) == 0 ? Device::parse(assigned)
                                                         : Device::cuda(0);
  check_device_available(device);
  if (opt.gpu_index >= 0) {
    const std::string host = "dpar-bench-host-" + std::to_string(rank);
    setenv("NCCL_HOSTID", host.c_str(), 1);
  }
  dist::Group& group = dist::default_group();
  RawNccl raw(*group.store(), rank, world, device.index);

  std::vector<size_t> sizes;
  for (size_t b = 1024; static_cast<double>(b) <= opt.max_mb * (1 << 20); b *= 4)
    sizes.push_back(b);
  if (rank == 0) {
    std::printf("bench_allreduce --device gpu: f32 sum all-reduce, %d ranks on %s (%s)\n", world,
                device.str().c_str(), cuda_device_summary(device).c_str());
    std::printf(
        "  dpar: group.allreduce({t})->wait() (stream wait); peer: raw ncclAllReduce on "
        "a second communicator; %s\n",
        opt.gpu_index >= 0 ? "ranks share one GPU (NCCL_HOSTID per rank, sockets on lo)"
                           : "one GPU per rank");
    std::printf("  median of %lld repetitions; busbw = 2(n-1)/n x size/time (GB/s = 1e9 B/s)\n\n",
                static_cast<long long>(opt.reps));
    std::printf("%8s %6s | %10s %8s | %10s %8s | %6s %9s\n", "size", "iters", "dpar/call", "busbw",
                "nccl/call", "busbw", "ratio", "overhead");
    std::fflush(stdout);
  }
  const double bus = 2.0 * (world - 1) / world;
  double min_ratio_1mb = 1e9, small_overhead_us = 0;
  int small_count = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const size_t bytes : sizes) {
    const size_t n = bytes / sizeof(float);
    Tensor t = Tensor::full({static_cast<int64_t>(n)}, rank + 1.0, DType::f32, device);
    group.allreduce({t})->wait();
    const double want = world * (world + 1) / 2.0;
    const std::vector<float> got = t.slice(0, 0, std::min<int64_t>(t.numel(), 4)).to_float_vector();
    for (float v : got) {
      DPAR_CHECK(v == want, "bench_allreduce: dpar's NCCL sum is ", v, ", expected ", want);
    }
    t.zero_();  // zeros stay zeros under repeated sums
    synchronize(device);
    // Large messages need few calls; small ones many, so the launch overhead is visible. But
    // never more than about 0.2 s a repetition: ranks time-slicing one GPU take milliseconds a
    // call even at 1 KB (each waits out the other's time slice), and 2000 such calls would take
    // the whole run. Rank 0's count for all, or the ranks' calls would not pair up.
    const auto c0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) group.allreduce({t})->wait();
    synchronize(device);
    const double per_call = seconds_since(c0) / 3.0;
    const int64_t by_size = static_cast<int64_t>((64.0 * (1 << 20)) / static_cast<double>(bytes));
    const int64_t by_time = static_cast<int64_t>(0.2 / std::max(per_call, 1e-7));
    Tensor agreed =
        Tensor::full({1},
                     static_cast<double>(std::clamp<int64_t>(std::min(by_size, by_time), 5,
                                                             std::max<int64_t>(5, opt.max_iters))),
                     DType::f32, device);
    group.broadcast({agreed}, 0)->wait();
    const auto iters = static_cast<int64_t>(agreed.to_float_vector()[0]);
    auto ours = [&] {
      for (int64_t i = 0; i < iters; ++i) group.allreduce({t})->wait();
      synchronize(device);
    };
    auto theirs = [&] {
      for (int64_t i = 0; i < iters; ++i) raw.allreduce(t.data<float>(), n);
      raw.sync();
    };
    ours();
    theirs();  // warm-up
    std::vector<double> ours_s, raw_s, ratio;
    for (int64_t r = 0; r < opt.reps; ++r) {
      group.barrier();
      auto t0 = std::chrono::steady_clock::now();
      ours();
      ours_s.push_back(seconds_since(t0) / static_cast<double>(iters));
      group.barrier();
      t0 = std::chrono::steady_clock::now();
      theirs();
      raw_s.push_back(seconds_since(t0) / static_cast<double>(iters));
      ratio.push_back(raw_s.back() / ours_s.back());
    }
    const double o = median(ours_s), p = median(raw_s), q = median(ratio);
    if (bytes >= (1u << 20)) min_ratio_1mb = std::min(min_ratio_1mb, q);
    if (bytes <= (64u << 10)) {
      small_overhead_us += (o - p) * 1e6;
      ++small_count;
    }
    rows.push_back({{"bytes", bytes}, {"dpar_s", o}, {"nccl_s", p}});
    if (rank == 0) {
      std::printf("%8s %6lld | %8.1fus %8.2f | %8.1fus %8.2f | %6.3f %7.1fus\n",
                  size_text(bytes).c_str(), static_cast<long long>(iters), o * 1e6,
                  bytes / o / 1e9 * bus, p * 1e6, bytes / p / 1e9 * bus, q, (o - p) * 1e6);
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    std::printf("\n  min ratio dpar/raw NCCL bus bandwidth at >= 1 MB: %.3fx (target >= 0.97)\n",
                min_ratio_1mb);
    if (small_count > 0) {
      std::printf("  overhead per call at <= 64 KB: %.1f us mean (target <= 5 us)\n",
                  small_overhead_us / small_count);
    }
  }
  dist::destroy();
  if (rank == 0 && opt.peer) {
    // torch.distributed NCCL with the same ranks and the same GPU arrangement.
    try {
      const nlohmann::json peer =
          run_peer("torch_allreduce_gpu.py",
                   "--world " + std::to_string(world) + " --max-mb " + std::to_string(opt.max_mb) +
                       " --reps " + std::to_string(opt.reps) + " --max-iters " +
                       std::to_string(opt.max_iters) +
                       (opt.gpu_index >= 0 ? " --shared-gpu " + std::to_string(opt.gpu_index) : ""),
                   4);
      std::printf("\n  torch.distributed (nccl), %s:\n", peer.value("torch", "?").c_str());
      for (const auto& row : rows) {
        const std::string key = std::to_string(row["bytes"].get<size_t>());
        if (!peer["seconds"].contains(key)) continue;
        const double ts = peer["seconds"][key].get<double>();
        const double os = row["dpar_s"].get<double>();
        std::printf("%8s | torch %8.1fus %8.2f GB/s busbw | dpar/torch bandwidth %6.3fx\n",
                    size_text(row["bytes"].get<size_t>()).c_str(), ts * 1e6,
                    row["bytes"].get<size_t>() / ts / 1e9 * bus, ts / os);
      }
    } catch (const Error& e) {
      std::printf("\n  torch.distributed peer did not run: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace dpar::bench
