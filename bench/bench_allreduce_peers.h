#pragma once
// bench_allreduce's peers: raw Gloo on a context of its own, and Open MPI's shared-memory
// collectives (bench/peers/mpi_allreduce.cpp under mpirun), for each collective it times.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "distributed/gloo/gloo_mesh.h"
#include "dpar/distributed/store.h"

namespace dpar::bench {

// The collective a run times: f32, sum where it reduces; `bytes` is the whole buffer (what
// allreduce and broadcast pass, what reduce_scatter reads and allgather writes on each rank).
enum class Collective { allreduce, reduce_scatter, allgather, broadcast };

inline const char* collective_name(Collective c) {
  switch (c) {
    case Collective::allreduce:
      return "allreduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::allgather:
      return "allgather";
    case Collective::broadcast:
      return "broadcast";
  }
  return "?";
}

// busbw / algbw, as nccl-tests defines it: the share of the buffer each rank's link carries.
inline double bus_factor(Collective c, int world) {
  const double n = world;
  switch (c) {
    case Collective::allreduce:
      return 2 * (n - 1) / n;
    case Collective::reduce_scatter:
    case Collective::allgather:
      return (n - 1) / n;
    case Collective::broadcast:
      return 1;
  }
  return 1;
}

// Raw Gloo: its own context over the job's store, bound to the dpar group's address. Its
// collectives: the default allreduce, allgather and broadcast of the new-style API, and the
// halving-doubling reduce-scatter (Gloo has no other for equal chunks).
class RawGloo {
 public:
  RawGloo(const std::shared_ptr<dpar::dist::Store>& store, int rank, int size,
          const std::string& address)
      : rank_(rank), size_(size) {
    gloo::transport::tcp::attr attr;
    attr.hostname = address;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    // The connections as dpar's group makes them; what is measured is Gloo's collective on them.
    auto prefixed = std::make_shared<dpar::dist::PrefixStore>("bench_allreduce/raw", store);
    dpar::dist::detail::MeshOptions mesh;
    mesh.rank = rank;
    mesh.size = size;
    mesh.timeout = std::chrono::minutes(2);
    context_ = dpar::dist::detail::connect_gloo_mesh(prefixed, device_, mesh);
  }

  // `data`: n floats; reduce_scatter leaves this rank's n / size at the start (partial sums
  // after it), allgather reads this rank's chunk and fills the others (in place), broadcast
  // sends rank 0's.
  void run(Collective c, float* data, size_t n) {
    switch (c) {
      case Collective::allreduce: {
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(data, n);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(next_tag());
        gloo::allreduce(opts);
        return;
      }
      case Collective::reduce_scatter: {
        if (!reduce_scatter_ || scatter_data_ != data || scatter_n_ != n) {
          reduce_scatter_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
              context_, std::vector<float*>{data}, static_cast<int>(n),
              std::vector<int>(static_cast<size_t>(size_), static_cast<int>(n) / size_));
          scatter_data_ = data;
          scatter_n_ = n;
        }
        reduce_scatter_->run();
        return;
      }
      case Collective::allgather: {
        gloo::AllgatherOptions opts(context_);
        // No input: Gloo's in-place form, this rank's chunk of the output is its contribution.
        opts.setOutput(data, n);
        opts.setTag(next_tag());
        gloo::allgather(opts);
        return;
      }
      case Collective::broadcast: {
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(data, n);
        opts.setRoot(0);
        opts.setTag(next_tag());
        gloo::broadcast(opts);
        return;
      }
    }
  }
  void barrier() {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag());
    gloo::barrier(opts);
  }
  int64_t broadcast_from_0(int64_t value) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(&value, 1);
    opts.setRoot(0);
    opts.setTag(next_tag());
    gloo::broadcast(opts);
    return value;
  }

 private:
  uint32_t next_tag() { return tag_++ % 0x7fffffffu; }
  int rank_, size_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> reduce_scatter_;
  float* scatter_data_ = nullptr;
  size_t scatter_n_ = 0;
  uint32_t tag_ = 1;
};

// Runs bench/peers/mpi_allreduce (built where Open MPI is found) under mpirun on Open MPI's
// shared-memory transport and prints its bandwidth beside dpar's (`ours`: bytes and dpar's
// seconds per call) for the sizes from 1 MB.
inline void run_open_mpi(Collective op, const std::vector<std::pair<size_t, double>>& ours,
                         int world, double min_seconds, int64_t reps) {
  const std::string peer = DPAR_MPI_PEER;
  if (peer.empty() || access(peer.c_str(), X_OK) != 0) {
    std::printf("\n  Open MPI peer skipped: %s%s\n",
                peer.empty() ? "this build found no MPI (scripts/bootstrap.sh installs Open MPI)"
                             : "no executable ",
                peer.c_str());
    return;
  }
  std::string sizes;
  for (const auto& [bytes, seconds] : ours) {
    if (bytes < (1u << 20)) continue;
    if (!sizes.empty()) sizes += ',';
    sizes += std::to_string(bytes);
  }
  if (sizes.empty()) return;
  // Open MPI's defaults: for ranks of one host it picks its shared-memory transport (vader,
  // with single-copy CMA where the kernel allows it) and binds each rank to a core. Where CMA is
  // refused (some containers), the same without the single-copy mechanism.
  const std::string mpirun =
      "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(world);
  const std::string args = " " + peer + " --op " + collective_name(op) + " --sizes " + sizes +
                           " --min-seconds " + std::to_string(min_seconds) + " --reps " +
                           std::to_string(reps);
  nlohmann::json result;
  std::string how = "its defaults";
  try {
    result = run_command_json(mpirun + args + " 2>/dev/null");
  } catch (const std::exception&) {
    how = "btl_vader_single_copy_mechanism none";
    try {
      result = run_command_json(mpirun + " --mca btl_vader_single_copy_mechanism none" + args);
    } catch (const std::exception& e) {
      std::printf("\n  Open MPI peer failed: %s\n", e.what());
      return;
    }
  }
  std::printf("\n  %s, %d ranks on this host (%s), %s:\n",
              result.at("library").get<std::string>().c_str(), world, how.c_str(),
              result.at("call").get<std::string>().c_str());
  const auto& mpi_sizes = result.at("sizes");
  const auto& mpi_seconds = result.at("seconds");
  for (size_t i = 0; i < mpi_sizes.size(); ++i) {
    const size_t bytes = mpi_sizes[i].get<size_t>();
    const double mpi_bw = static_cast<double>(bytes) / mpi_seconds[i].get<double>() / 1e9;
    for (const auto& [our_bytes, our_seconds] : ours) {
      if (our_bytes != bytes) continue;
      const double bw = static_cast<double>(bytes) / our_seconds / 1e9;
      std::printf(
          "  %8s: open mpi %7.3f GB/s, dpar %7.3f GB/s: dpar/open mpi %.2fx%s\n",
          size_text(bytes).c_str(), mpi_bw, bw, bw / mpi_bw,
          op == Collective::allreduce && bytes == (10u << 20) ? " (target >= 1 at 10 MB)" : "");
    }
  }
}

}  // namespace dpar::bench
