// Run under dpar-launch: every collective x dtype x size on the job's ranks, each result
// checked exactly against values every rank can compute on its own. Exits non-zero (with a
// line naming the case) on the first mismatch. The tensors live on --device (cpu: the Gloo
// group; gpu:N: the NCCL group, or Gloo through host memory with DPAR_DIST_BACKEND=gloo).
#include <cstdio>
#include <string>

#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"
#include "worker_device.h"

using namespace dpar;
using namespace dpar::dist;

namespace {

// Rank r's value for element i: small integers, exact in every dtype (f16/bf16 included).
double value(int rank, int64_t i) { return static_cast<double>((rank + 1) * ((i % 7) + 1)); }

Device device = Device::cpu();

Tensor make(int rank, int64_t n, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(value(rank, i));
  return Tensor::from_vector(v, {n}).to(dtype).to(device);
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw Error("collective check failed: " + what);
}

void check_values(const Tensor& t, const std::function<double(int64_t)>& want,
                  const std::string& what) {
  const std::vector<float> got = t.to(DType::f32).to_float_vector();
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want(static_cast<int64_t>(i));
    if (static_cast<double>(got[i]) != w) {
      throw Error(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                  ", expected " + std::to_string(w));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("collectives_worker", [&] {
    Flags flags("collectives_worker", "checks every collective (run under dpar-launch)");
    auto& big = flags.add_int("big", 1000003, "the large size (1M+3 by default)");
    auto& device_flag =
        flags.add_string("device", "", "cpu or gpu:N (default: $DPAR_TEST_DEVICE, else cpu)");
    auto& gpu_check = flags.add_bool("gpu-check", false,
                                     "print 'gpu ok' or why no CUDA device can be used, and exit");
    // Positional arguments are ignored: tests pass a marker to find the job's processes.
    flags.parse(argc, argv, /*allow_positional=*/true);
    if (gpu_check) {
      std::printf("%s\n", cuda_device_count() > 0 ? "gpu ok" : cuda_unavailable_reason().c_str());
      return 0;
    }
    device = test::worker_device(device_flag);
    init_parallel_env();
    const int rank = get_rank(), world = get_world_size();
    test::distinct_nccl_host_if_asked(rank);
    Group& g = default_group();
    int cases = 0;
    const std::vector<DType> dtypes{DType::f32, DType::f16, DType::bf16, DType::i64};
    for (DType dt : dtypes) {
      std::vector<int64_t> sizes{0, 1, 7};
      if (dt == DType::f32) sizes.push_back(big);
      for (int64_t n : sizes) {
        const std::string tag = std::string(dtype_name(dt)) + "[" + std::to_string(n) + "]";
        double sum_ranks = 0;
        for (int r = 0; r < world; ++r) sum_ranks += r + 1;
        auto base = [](int64_t i) { return static_cast<double>((i % 7) + 1); };
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
          Tensor t = make(rank, n, dt);
          g.allreduce({t}, op)->wait();
          check_values(
              t,
              [&](int64_t i) {
                switch (op) {
                  case ReduceOp::Sum:
                    return sum_ranks * base(i);
                  case ReduceOp::Avg: {
                    const double avg = sum_ranks * base(i) / world;
                    return dt == DType::i64 ? static_cast<double>(static_cast<int64_t>(avg)) : avg;
                  }
                  case ReduceOp::Max:
                    return world * base(i);
                  case ReduceOp::Min:
                    return base(i);
                }
                return 0.0;
              },
              std::string("allreduce ") + reduce_op_name(op) + " " + tag);
          ++cases;
        }
        const int root = world - 1;
        Tensor b = make(rank, n, dt);
        g.broadcast({b}, root)->wait();
        check_values(
            b, [&](int64_t i) { return value(root, i); }, "broadcast " + tag);
        std::vector<Tensor> outs;
        for (int r = 0; r < world; ++r) outs.push_back(Tensor::zeros({n}, dt, device));
        g.allgather(outs, make(rank, n, dt))->wait();
        for (int r = 0; r < world; ++r) {
          check_values(
              outs[static_cast<size_t>(r)], [&](int64_t i) { return value(r, i); },
              "allgather " + tag + " from rank " + std::to_string(r));
        }
        // reduce_scatter with uneven pieces: piece r has n + r elements.
        std::vector<Tensor> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(make(rank, n + r, dt));
        Tensor out = Tensor::zeros({n + rank}, dt, device);
        g.reduce_scatter(out, inputs, ReduceOp::Sum)->wait();
        check_values(
            out, [&](int64_t i) { return sum_ranks * base(i); }, "reduce_scatter " + tag);
        cases += 3;
      }
    }
    g.barrier();
    expect(cases > 0, "no cases ran");
    std::printf("rank %d/%d: %d collective cases passed on %s (%s)\n", rank, world, cases,
                device.str().c_str(), g.backend_for(device).backend_name().c_str());
    destroy();
    return 0;
  });
}
