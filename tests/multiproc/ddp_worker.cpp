// Run under dpar-launch. Trains a small conv net with DataParallel on rank-specific data and
// checks (1) parameters are bitwise equal on every rank and (2) they match, within 1e-5
// relative, one process training the same model on the concatenation of all ranks' batches.
// Modes: --no-sync (gradient accumulation over 2 micro-batches), --unequal (rank r has 3+2r
// samples; sample-weighted average), --bf16 (compressed gradients: equal across ranks, and
// within bf16's precision of the reference). Failure drills: --die-rank/--die-step (SIGKILL
// itself), --stop-rank (SIGSTOPs itself at --die-step, as a rank wedged in the kernel or a
// debugger would), --skip-rank (skips one all-reduce), --mismatch-rank (all-reduces a
// different shape).
// --device gpu:N (or $DPAR_TEST_DEVICE) runs model, data, buckets and the reference there.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"
#include "worker_device.h"

using namespace dpar;
using namespace dpar::dist;

namespace {

Device device = Device::cpu();

std::shared_ptr<nn::Module> make_model() {
  manual_seed(42);  // same initial weights on every rank and in the reference
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Conv2d>(8, 8, 3, 2, 1));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  net->push_back(std::make_shared<nn::Flatten>(1));
  net->push_back(std::make_shared<nn::Linear>(8, 5));
  net->to(device);
  return net;
}

int64_t batch_of(int rank, bool unequal) { return unequal ? 3 + 2 * rank : 4; }

// Rank r's micro-batch m of step s, generated identically on every process.
std::pair<Tensor, Tensor> batch(int rank, int step, int micro, bool unequal) {
  const int64_t n = batch_of(rank, unequal);
  Generator gen(1000 + 97 * static_cast<uint64_t>(rank) + 13 * static_cast<uint64_t>(step) + micro);
  std::vector<float> x(static_cast<size_t>(n * 3 * 8 * 8));
  for (float& v : x) v = gen.normal();
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (auto& v : y) v = static_cast<int64_t>(gen.next_u64() % 5);
  return {Tensor::from_vector(x, {n, 3, 8, 8}).to(device), Tensor::from_vector(y, {n}).to(device)};
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.size(0);
  Shape shape = parts[0].shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, parts[0].dtype(), parts[0].device());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    out.slice(0, at, at + p.size(0)).copy_(p);
    at += p.size(0);
  }
  return out;
}

std::vector<float> flat_params(nn::Module& m) {
  std::vector<float> all;
  for (const Tensor& p : m.parameters()) {
    auto v = p.to_float_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("ddp_worker", [&] {
    Flags flags("ddp_worker",
                "DataParallel equivalence and failure drills (run under dpar-launch)");
    auto& steps = flags.add_int("steps", 3, "SGD steps");
    auto& no_sync =
        flags.add_bool("no-sync", false, "accumulate 2 micro-batches per step under no_sync");
    auto& unequal = flags.add_bool("unequal", false, "rank r gets 3+2r samples");
    auto& die_rank = flags.add_int("die-rank", -1, "this rank SIGKILLs itself at --die-step");
    auto& die_step = flags.add_int("die-step", 1, "step at which --die-rank dies");
    auto& stop_rank = flags.add_int("stop-rank", -1, "this rank SIGSTOPs itself at --die-step");
    auto& skip_rank = flags.add_int("skip-rank", -1, "this rank skips one all-reduce");
    auto& mismatch_rank =
        flags.add_int("mismatch-rank", -1, "this rank all-reduces a different shape");
    auto& bucket_mb = flags.add_double("bucket-mb", 25, "comm_buffer_size in MB");
    auto& bf16 = flags.add_bool("bf16", false, "gradients travel as bf16 (comm_dtype)");
    auto& device_flag =
        flags.add_string("device", "", "cpu or gpu:N (default: $DPAR_TEST_DEVICE, else cpu)");
    // Positional arguments are ignored: tests pass a marker to find the job's processes.
    flags.parse(argc, argv, /*allow_positional=*/true);
    set_num_threads(1);
    device = test::worker_device(device_flag);
    init_parallel_env();
    const int rank = get_rank(), world = get_world_size();
    test::distinct_nccl_host_if_asked(rank);

    if (skip_rank >= 0 || mismatch_rank >= 0) {
      Tensor t = Tensor::ones({rank == mismatch_rank ? 999 : 1000}, DType::f32, device);
      if (rank != skip_rank) default_group().allreduce({t})->wait();
      default_group().barrier();
      std::printf("rank %d: drill finished without error\n", rank);
      return 0;
    }

    auto model = make_model();
    DataParallelOptions dp_options;
    dp_options.comm_buffer_size = bucket_mb;
    dp_options.last_comm_buffer_size = bucket_mb / 25;
    if (bf16) dp_options.comm_dtype = DType::bf16;
    DataParallel dp(model, dp_options);
    optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    const int micro_batches = no_sync ? 2 : 1;
    for (int s = 0; s < steps; ++s) {
      if (rank == stop_rank && s == die_step) {
        std::printf("rank %d: stopping myself with SIGSTOP at step %d\n", rank, s);
        std::fflush(stdout);
        std::raise(SIGSTOP);
      }
      if (rank == die_rank && s == die_step) {
        // The epoch time lets the drill time the teardown from the kill itself, not from the
        // launch (on a GPU, CUDA start-up and NCCL set-up come first and take seconds).
        const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        std::printf("rank %d: killing myself with SIGKILL at step %d (epoch ms %lld)\n", rank, s,
                    static_cast<long long>(now_ms));
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      opt.zero_grad();
      for (int m = 0; m < micro_batches; ++m) {
        auto [x, y] = batch(rank, s, m, unequal);
        // The loss of a micro-batch is scaled so the accumulated gradient is the mean over
        // all of this rank's samples of the step.
        auto run = [&] {
          Tensor out = unequal ? dp.forward(x, x.size(0)) : dp.forward(x);
          mul(cross_entropy(out, y), 1.0 / micro_batches).backward();
        };
        if (m + 1 < micro_batches) {
          auto guard = dp.no_sync();
          run();
        } else {
          run();
        }
      }
      opt.step();
    }

    // (1) bitwise equal across ranks.
    const std::vector<float> mine = flat_params(*model);
    std::vector<Tensor> gathered;
    for (int r = 0; r < world; ++r)
      gathered.push_back(Tensor::zeros({static_cast<int64_t>(mine.size())}, DType::f32, device));
    default_group()
        .allgather(gathered,
                   Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}).to(device))
        ->wait();
    for (int r = 0; r < world; ++r) {
      const auto other = gathered[static_cast<size_t>(r)].to_float_vector();
      DPAR_CHECK(std::memcmp(other.data(), mine.data(), mine.size() * sizeof(float)) == 0,
                 "parameters of rank ", r, " differ bitwise from rank ", rank);
    }

    // (2) the single-process reference on the concatenated batches.
    auto ref = make_model();
    optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    for (int s = 0; s < steps; ++s) {
      ref_opt.zero_grad();
      for (int m = 0; m < micro_batches; ++m) {
        std::vector<Tensor> xs, ys;
        for (int r = 0; r < world; ++r) {
          auto [x, y] = batch(r, s, m, unequal);
          xs.push_back(x);
          ys.push_back(y);
        }
        mul(cross_entropy(ref->forward(concat_rows(xs)), concat_rows(ys)), 1.0 / micro_batches)
            .backward();
      }
      ref_opt.step();
    }
    const std::vector<float> want = flat_params(*ref);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(want[i] - mine[i])));
      scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    }
    const double rel = worst / std::max(scale, 1e-12);
    // bf16 keeps 8 bits of mantissa: each step's gradients carry ~0.4% relative rounding.
    const double tolerance = bf16 ? 1e-2 : 1e-5;
    DPAR_CHECK(rel <= tolerance,
               "DataParallel parameters differ from the single-process reference: ",
               "relative error ", rel, " > ", tolerance);
    DPAR_CHECK(!bf16 || rel > 0, "--bf16: the parameters equal the f32 reference exactly");
    if (rank == 0) {
      std::printf(
          "ddp_worker: %d ranks on %s, %lld steps%s%s%s: bitwise equal across ranks, relative "
          "error %.2e vs single process\n",
          world, device.is_cpu() ? "cpu" : "gpu", static_cast<long long>(steps),
          no_sync ? ", no_sync accumulation" : "", unequal ? ", unequal local batches" : "",
          bf16 ? ", bf16 gradients" : "", rel);
    }
    destroy();
    return 0;
  });
}
