// Collective throughput of dpar's Gloo process group beside raw Gloo and Open MPI, 2 ranks
// (--nproc), in the same invocation: allreduce, or with --op reduce_scatter, allgather or
// broadcast (bench_allreduce_peers.h says what each peer calls). The default group runs them
// through shared memory when every rank is on this host (shm_collectives.h); a second group with
// shared memory off times dpar's TCP ring beside it; after the table rank 0 runs Open MPI's
// collective on its shared-memory transport (bench/peers/mpi_allreduce.cpp under mpirun) at the
// sizes from 1 MB, the other ranks idle.
// Started on its own it re-launches itself through dpar-launch (processes on loopback); under a
// launcher (DPAR_RANK set, or --worker) it is one of the ranks. For every size every rank times
// dpar's synchronous call (e.g. `default_group().allreduce({t}, Sum, false)`: raw Gloo's call is
// blocking too) and raw Gloo's on a second Gloo context rendezvoused through the same store and
// bound to the same address, alternating them so they share the machine's noise. Rank 0 prints
// ours, the peer (raw Gloo) and the ratio per size. dpar's TCP ring checks a CRC-32C on every hop
// (checked_ring.h), so its ratio includes what the checks cost; raw Gloo checks nothing. --async
// times the asynchronous call and wait() instead, which hands the call to the group's
// communication thread and back. --diag adds voluntary context switches and CPU time per call:
// each thread hand-off is a context switch.
// --device gpu measures dpar's NCCL group instead, beside raw NCCL and torch.distributed
// (bench_allreduce_nccl.cpp; CUDA builds).
// On a busy machine every wake-up may wait for a time slice, which swamps the comparison;
// `chrt -f 10 bench_allreduce` (as root; the ranks inherit it) keeps other work from delaying
// both sides. --recorder only measures the flight recorder (one process).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench_allreduce_gpu.h"
#include "bench_allreduce_peers.h"
#include "bench_util.h"
#include "distributed/flight_recorder.h"
#include "distributed/gloo/bind_address.h"
#include "distributed/gloo/gloo_mesh.h"
#include "distributed/gloo/process_group_gloo.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"

using namespace dpar;

namespace {

struct Options {
  double max_mb = 64;
  double min_seconds = 0.3;
  int64_t reps = 5;
  bool check = true;
  bool diag = false;
  bool async = false;
  bool mpi = true;
  bench::Collective op = bench::Collective::allreduce;
  int hosts = 1;
};

// ---- driver: re-launch through dpar-launch -------------------------------------------------

[[noreturn]] void exec_launcher(const std::string& launcher, int start_port, int nproc, int argc,
                                char** argv) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  DPAR_CHECK(n > 0, "bench_allreduce: cannot read /proc/self/exe");
  self[n] = '\0';
  // The workers get the same flags; --worker stops them from launching again.
  std::vector<std::string> args{launcher, "--nproc_per_node=" + std::to_string(nproc),
                                "--log_dir=", "--start_port=" + std::to_string(start_port), self};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  args.emplace_back("--worker");
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execv(launcher.c_str(), cargs.data());
  DPAR_FAIL("bench_allreduce: cannot run the launcher ", launcher, ": ", std::strerror(errno),
            " (pass --launcher=<path to dpar-launch>)");
}

// ---- worker ----------------------------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Row {
  size_t bytes;
  int64_t iters;
  double ours_s;  // median seconds per call
  double ring_s;  // dpar's TCP ring (a second group with shared memory off)
  double raw_s;
  // Median over repetitions of (dpar time / gloo time) of the two adjacent runs: on a busy
  // machine neighbours share the noise, so this is steadier than the ratio of the medians.
  double time_ratio;
  // Per call, over every thread of this process (--diag): voluntary context switches (each
  // hand-off between threads is one, and on a loaded machine each can wait for a time slice)
  // and CPU time.
  double ours_csw, raw_csw;
  double ours_cpu_s, raw_cpu_s;
};

struct Usage {
  int64_t csw = 0;
  double cpu_s = 0;
  static Usage now() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
    return {u.ru_nvcsw, secs(u.ru_utime) + secs(u.ru_stime)};
  }
};

int run_worker(const Options& opt) {
  const bench::Collective op = opt.op;
  dist::init_parallel_env();
  const int rank = dist::get_rank(), world = dist::get_world_size();
  DPAR_CHECK(world >= 2, "bench_allreduce --worker: needs a launcher with at least 2 ranks, got ",
             world);
  dist::Group& group = dist::default_group();
  auto backend = group.backend_ptr_for(Device::cpu());
  DPAR_CHECK(backend->backend_name() == "gloo", "bench_allreduce: the CPU backend is ",
             backend->backend_name(), ", not gloo");
  // The address dpar's group listens on (it was created with the default options).
  const std::string address = dist::detail::default_bind_address(group.store().get());
  const bool detail = dist::ProcessGroupOptions::from_env().debug_detail;
  bench::RawGloo raw(group.store(), rank, world, address);
  // dpar's own TCP ring beside the default group (which uses shared memory when every rank is
  // on this host): the same group with shared memory off.
  dist::ProcessGroupOptions ring_options = dist::ProcessGroupOptions::from_env();
  ring_options.shared_memory = false;
  const auto ring_group = dist::make_gloo_group(
      std::make_shared<dist::PrefixStore>("bench_allreduce/ring", group.store()), rank, world,
      ring_options);
  // --hosts: "dpar" is a group whose ranks take consecutive blocks as host identities, so it
  // runs the hierarchical (mixed) ring: shared memory within a block, TCP between blocks.
  DPAR_CHECK(opt.hosts <= world, "bench_allreduce: --hosts=", opt.hosts, " for ", world,
             " ranks: expected at most one host per rank");
  std::shared_ptr<dist::ProcessGroup> hosts_group;
  if (opt.hosts > 1) {
    dist::ProcessGroupOptions hosts_options = dist::ProcessGroupOptions::from_env();
    hosts_options.host_identity = "bench host " + std::to_string(rank * opt.hosts / world);
    hosts_group = dist::make_gloo_group(
        std::make_shared<dist::PrefixStore>("bench_allreduce/hosts", group.store()), rank, world,
        hosts_options);
  }
  const auto* gloo_backend = dynamic_cast<const dist::detail::ProcessGroupGloo*>(
      hosts_group ? hosts_group.get() : backend.get());
  const std::string transport = gloo_backend ? gloo_backend->transport() : "?";

  std::vector<size_t> sizes;
  for (size_t b = 1024; b <= (64u << 20); b *= 4) sizes.push_back(b);
  sizes.push_back(10u << 20);
  sizes.push_back(16u << 20);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::erase_if(sizes, [&](size_t b) { return static_cast<double>(b) > opt.max_mb * (1 << 20); });

  const std::string load_before = bench::load_average();
  if (rank == 0) {
    const char* name = bench::collective_name(op);
    std::printf(
        "bench_allreduce: f32 %s%s, %d ranks on %s, %ld CPU(s), DETAIL %s, dpar call: %s (%s)\n",
        name,
        op == bench::Collective::broadcast   ? " from rank 0"
        : op == bench::Collective::allgather ? " in place"
                                             : " (sum)",
        world, address.c_str(), sysconf(_SC_NPROCESSORS_ONLN),
        detail ? "ON (slows every call)" : "off", name,
        opt.async ? "async, then wait()" : "synchronous");
    std::printf(
        "  dpar: %s, collectives over %s; dpar ring: the same group with shared "
        "memory off (its CRC-32C-checked TCP ring; Gloo's broadcast tree); peer: raw Gloo's %s "
        "(%s, no checksum) on a second context, same store and address\n",
        (hosts_group ? "a group of " + std::to_string(opt.hosts) + " pretend hosts (--hosts)"
                     : std::string("the default group"))
            .c_str(),
        transport.c_str(), name,
        op == bench::Collective::reduce_scatter ? "ReduceScatterHalvingDoubling<float>"
                                                : "default algorithm");
    std::printf(
        "  size: the whole buffer; median of %lld repetitions, >= %.2f s each; GB/s = 1e9 B/s; "
        "busbw = %.2f x algbw\n  ratio and overhead %%: median over repetitions of the adjacent "
        "dpar/gloo pair\n\n",
        static_cast<long long>(opt.reps), opt.min_seconds, bench::bus_factor(op, world));
    std::printf("%8s %7s | %11s %8s %8s | %11s %8s | %11s %8s | %6s %9s %8s\n", "size", "iters",
                "dpar/call", "algbw", "busbw", "ring/call", "algbw", "gloo/call", "algbw", "ratio",
                "overhead", "");
    std::printf("%8s %7s | %11s %8s %8s | %11s %8s | %11s %8s | %6s %9s %8s\n", "", "", "", "GB/s",
                "GB/s", "", "GB/s", "", "GB/s", "bw", "%", "us");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  for (const size_t whole : sizes) {
    // Equal chunks for reduce_scatter and allgather (the peers take no others).
    const size_t chunk = whole / sizeof(float) / static_cast<size_t>(world);
    const size_t n = chunk * static_cast<size_t>(world), bytes = n * sizeof(float);
    Tensor t = Tensor::empty({static_cast<int64_t>(n)});
    Tensor mine = Tensor::empty({static_cast<int64_t>(chunk)});  // reduce_scatter's output
    std::vector<float> buf(n);
    // t's rank chunks, made once: the timed calls then pay for the collective, not for views.
    std::vector<Tensor> pieces;
    for (int r = 0; r < world; ++r) {
      const auto lo = static_cast<int64_t>(chunk) * r;
      pieces.push_back(t.slice(0, lo, lo + static_cast<int64_t>(chunk)));
    }
    // dpar's call on a group, synchronous or (--async) handed to its thread and waited for.
    auto call = [&](auto& pg) {
      std::shared_ptr<dist::Work> work;
      switch (op) {
        case bench::Collective::allreduce:
          work = pg.allreduce({t}, dist::ReduceOp::Sum, opt.async);
          break;
        case bench::Collective::reduce_scatter:
          work = pg.reduce_scatter(mine, pieces, dist::ReduceOp::Sum, opt.async);
          break;
        case bench::Collective::allgather:  // in place, as the peers (and sharded training)
          work = pg.allgather(pieces, pieces[static_cast<size_t>(rank)], opt.async);
          break;
        case bench::Collective::broadcast:
          work = pg.broadcast({t}, 0, opt.async);
          break;
      }
      if (opt.async) work->wait();
    };
    auto ours = [&] { hosts_group ? call(*hosts_group) : call(group); };
    auto theirs = [&] { raw.run(op, buf.data(), n); };
    auto ring = [&] { call(*ring_group); };

    if (opt.check) {
      // Rank r contributes r + 1 everywhere; what each rank must hold afterwards, where.
      const float value = static_cast<float>(rank + 1);
      const float sum = static_cast<float>(world * (world + 1) / 2);
      auto expected = [&](size_t i) {  // element i of the whole buffer
        switch (op) {
          case bench::Collective::allreduce:
            return sum;
          case bench::Collective::reduce_scatter:
            return i / chunk == static_cast<size_t>(rank) ? sum : value;
          case bench::Collective::allgather:
            return static_cast<float>(i / chunk + 1);
          case bench::Collective::broadcast:
            return 1.0f;
        }
        return 0.0f;
      };
      const size_t own = static_cast<size_t>(rank) * chunk;
      std::vector<std::pair<std::string, std::vector<float>>> results;
      for (int which = 0; which < 2; ++which) {  // the default group, then the TCP ring
        t.fill_(value);
        mine.fill_(value);
        which == 0 ? ours() : ring();
        std::vector<float> got = t.to_float_vector();
        // reduce_scatter's result is its output, allgather's the whole buffer.
        if (op == bench::Collective::reduce_scatter) {
          const std::vector<float> part = mine.to_float_vector();
          std::copy(part.begin(), part.end(), got.begin() + static_cast<int64_t>(own));
        }
        results.emplace_back(which == 0 ? "dpar" : "dpar ring", std::move(got));
      }
      std::fill(buf.begin(), buf.end(), value);
      theirs();
      results.emplace_back("gloo", buf);
      for (const auto& [who, got] : results) {
        for (size_t i = 0; i < n; ++i) {
          // Raw Gloo's halving-doubling reduce-scatter leaves this rank's result at the start of
          // the buffer and partial sums elsewhere.
          const bool raw_scatter = who == "gloo" && op == bench::Collective::reduce_scatter;
          if (raw_scatter) {
            if (i >= chunk) break;
            DPAR_CHECK(got[i] == sum, "bench_allreduce: gloo's reduce_scatter is wrong at element ",
                       i, " of ", bench::size_text(bytes), ": ", got[i], ", expected ", sum);
            continue;
          }
          DPAR_CHECK(got[i] == expected(i), "bench_allreduce: ", who, "'s ",
                     bench::collective_name(op), " is wrong at element ", i, " of ",
                     bench::size_text(bytes), ": ", got[i], ", expected ", expected(i));
        }
      }
    }
    // Zeros stay zeros under repeated sums: no overflow or denormals skew the timing.
    t.zero_();
    mine.zero_();
    std::fill(buf.begin(), buf.end(), 0.0f);

    // Calibration (also the warm-up): batches of doubling length until one takes 50 ms on
    // rank 0. Rank 0 decides when to stop and tells the others, so every rank makes the same
    // calls (a collective that one rank skips would hang the other).
    auto per_call = [&](auto&& fn) {
      fn();
      for (int64_t k = 1;; k *= 2) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < k; ++i) fn();
        const double s = bench::seconds_since(t0);
        if (raw.broadcast_from_0(s >= 0.05 || k >= (1 << 16))) return s / static_cast<double>(k);
      }
    };
    // Calls per timed loop, each implementation its own: shared memory can be hundreds of
    // times faster than TCP at small sizes, and one count for all would time either a few
    // microseconds of one or minutes of another.
    auto iterations = [&](auto&& fn) {
      return raw.broadcast_from_0(
          std::max<int64_t>(1, static_cast<int64_t>(std::ceil(opt.min_seconds / per_call(fn)))));
    };
    const int64_t ours_iters = iterations(ours), raw_iters = iterations(theirs),
                  ring_iters = iterations(ring);
    const int64_t iters = ours_iters;

    Usage ours_use, raw_use, ring_use;
    auto timed = [&](auto&& fn, Usage& use, int64_t n_calls) {
      raw.barrier();
      const Usage u0 = Usage::now();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < n_calls; ++i) fn();
      const double s = bench::seconds_since(t0) / static_cast<double>(n_calls);
      const Usage u1 = Usage::now();
      use.csw += u1.csw - u0.csw;
      use.cpu_s += u1.cpu_s - u0.cpu_s;
      return s;
    };
    std::vector<double> ours_t, raw_t, ring_t;
    for (int64_t r = 0; r < opt.reps; ++r) {
      // ABBA order: no implementation always runs first after the barrier.
      if (r % 2 == 0) {
        ours_t.push_back(timed(ours, ours_use, ours_iters));
        raw_t.push_back(timed(theirs, raw_use, raw_iters));
        ring_t.push_back(timed(ring, ring_use, ring_iters));
      } else {
        ring_t.push_back(timed(ring, ring_use, ring_iters));
        raw_t.push_back(timed(theirs, raw_use, raw_iters));
        ours_t.push_back(timed(ours, ours_use, ours_iters));
      }
    }
    std::vector<double> pair_ratio;
    for (size_t r = 0; r < ours_t.size(); ++r) pair_ratio.push_back(ours_t[r] / raw_t[r]);
    const double ours_calls = static_cast<double>(ours_iters * opt.reps);
    const double raw_calls = static_cast<double>(raw_iters * opt.reps);
    const Row row{bytes,
                  iters,
                  median(ours_t),
                  median(ring_t),
                  median(raw_t),
                  median(pair_ratio),
                  static_cast<double>(ours_use.csw) / ours_calls,
                  static_cast<double>(raw_use.csw) / raw_calls,
                  ours_use.cpu_s / ours_calls,
                  raw_use.cpu_s / raw_calls};
    rows.push_back(row);
    if (rank == 0) {
      const double algbw = static_cast<double>(bytes) / row.ours_s / 1e9;
      const double raw_bw = static_cast<double>(bytes) / row.raw_s / 1e9;
      const double bus = bench::bus_factor(op, world);
      const double ring_bw = static_cast<double>(bytes) / row.ring_s / 1e9;
      std::printf(
          "%8s %7lld | %9.1fus %8.3f %8.3f | %9.1fus %8.3f | %9.1fus %8.3f | %6.3f %8.1f%% %8.1f",
          bench::size_text(bytes).c_str(), static_cast<long long>(iters), row.ours_s * 1e6, algbw,
          algbw * bus, row.ring_s * 1e6, ring_bw, row.raw_s * 1e6, raw_bw, 1 / row.time_ratio,
          (row.time_ratio - 1) * 100, (row.ours_s - row.raw_s) * 1e6);
      if (opt.diag) {
        std::printf(" | %5.1f %5.1f %8.1f %8.1f", row.ours_csw, row.raw_csw, row.ours_cpu_s * 1e6,
                    row.raw_cpu_s * 1e6);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  if (rank == 0) {
    double min_ratio = 0;
    size_t min_at = 0;
    std::vector<double> small_us, small_pct;
    std::string over;
    for (const Row& r : rows) {
      const double ratio = 1 / r.time_ratio;
      if (r.bytes >= (1u << 20) && (min_at == 0 || ratio < min_ratio)) {
        min_ratio = ratio;
        min_at = r.bytes;
      }
      if (r.bytes <= (16u << 10)) {
        small_us.push_back((r.ours_s - r.raw_s) * 1e6);
        small_pct.push_back((r.time_ratio - 1) * 100);
      }
      if (r.bytes >= (64u << 10) && r.time_ratio > 1.05) {
        over += (over.empty() ? "" : ", ") + bench::size_text(r.bytes);
      }
    }
    std::printf("\n");
    if (min_at) {
      std::printf("  min ratio dpar/gloo (bandwidth) over sizes >= 1 MB: %.3fx (at %s)\n",
                  min_ratio, bench::size_text(min_at).c_str());
    }
    if (!small_us.empty()) {
      std::printf("  overhead at sizes <= 16 KB: median %.1f us per call (%.1f%%)\n",
                  median(small_us), median(small_pct));
    }
    std::printf("  sizes >= 64 KB with overhead > 5%%: %s\n", over.empty() ? "none" : over.c_str());
    if (op == bench::Collective::allreduce) {
      std::printf(
          "  reference (PyTorch's gloo here, reference-facts.md): 0.67 / 0.73 / 0.70 GB/s "
          "at 10 / 16 / 64 MB\n");
    }
    std::printf("  load average before / after: %s / %s (%d ranks on %ld CPU(s))\n",
                load_before.c_str(), bench::load_average().c_str(), world,
                sysconf(_SC_NPROCESSORS_ONLN));
  }
  // Open MPI's shared-memory collective at the same sizes (>= 1 MB), run by rank 0 while the
  // other ranks wait, so the two never share the cores.
  if (opt.mpi) {
    if (rank == 0) {
      std::vector<std::pair<size_t, double>> ours;
      for (const Row& r : rows) ours.emplace_back(r.bytes, r.ours_s);
      bench::run_open_mpi(op, ours, world, opt.min_seconds, opt.reps);
    }
    if (rank == 0) group.store()->set("bench_allreduce/mpi_done", {1});
    group.store()->wait({"bench_allreduce/mpi_done"}, std::chrono::minutes(30));
  }
  dist::destroy();
  return 0;
}

// --recorder: what the flight recorder adds to a collective (a record's enqueue, start and end,
// as a group makes them), beside the whole of a 1-element all-reduce on a world of one, which
// includes it. One process, no launcher.
int run_recorder_bench() {
  using Clock = std::chrono::steady_clock;
  constexpr int64_t kCalls = 1000000;
  dist::detail::FlightRecorder recorder("bench/recorder", "gloo", 0, 2);
  const Tensor t = Tensor::ones({1000});
  dist::detail::CollectiveInfo info = dist::detail::describe_call(
      dist::detail::CollectiveKind::Allreduce, {t}, dist::ReduceOp::Sum, 0);
  const dist::detail::CollectiveLabel label("DataParallel bucket 0");
  std::vector<double> record_ns;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    for (int64_t i = 1; i <= kCalls; ++i) {
      info.seq = rep * kCalls + i;
      recorder.enqueued(info);
      recorder.started(info.seq);
      recorder.ended(info.seq, true);
    }
    record_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                        kCalls);
  }
  auto group = dist::make_gloo_group(nullptr, 0, 1);
  Tensor x = Tensor::ones({1});
  constexpr int64_t kAllreduces = 200000;
  std::vector<double> allreduce_ns;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < kAllreduces; ++i) group->allreduce({x}, dist::ReduceOp::Sum, false);
    allreduce_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                           kAllreduces);
  }
  const double ours = bench::median(record_ns), whole = bench::median(allreduce_ns);
  std::printf(
      "flight recorder: %.0f ns per collective (enqueue + start + end, median of 5 x %lld)\n", ours,
      static_cast<long long>(kCalls));
  std::printf(
      "1-element allreduce, world of one, synchronous: %.0f ns per call, recorder "
      "included (%.0f%% of it)\n",
      whole, 100.0 * ours / whole);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("bench_allreduce", [&] {
    Flags flags("bench_allreduce",
                "Collective throughput, 2 ranks: dpar's gloo group vs raw Gloo and Open MPI");
    auto& max_mb =
        flags.add_double("max-mb", 0, "largest message in MB (0: 64 on cpu, 256 on gpu)");
    auto& device = flags.add_string("device", "cpu",
                                    "cpu (dpar's gloo group vs raw Gloo) or gpu (dpar's NCCL "
                                    "group vs raw NCCL and torch.distributed)");
    auto& gpu_index = flags.add_int(
        "gpu-index", 0, "--device gpu: every rank on this GPU (-1: the launcher's GPU per rank)");
    auto& nproc = flags.add_int("nproc", 2, "ranks");
    auto& peer = flags.add_bool("peer", true, "--device gpu: also run torch.distributed (nccl)");
    auto& min_seconds =
        flags.add_double("min-seconds", 0.3, "timed seconds per repetition and implementation");
    auto& reps = flags.add_int("reps", 5, "repetitions per size (the median is reported)");
    auto& max_iters = flags.add_int("max-iters", 2000,
                                    "--device gpu: calls per timed loop at most (64 MB / size)");
    auto& check = flags.add_bool("check", true, "verify each size's results before timing");
    auto& diag = flags.add_bool("diag", false,
                                "also print context switches and CPU time per call (this process)");
    auto& async = flags.add_bool(
        "async", false, "time the asynchronous call and wait() instead of the synchronous call");
    auto& mpi = flags.add_bool("mpi", true,
                               "also run Open MPI's shared-memory collective (mpirun) at >= 1 MB");
    auto& hosts = flags.add_int(
        "hosts", 1,
        "split the ranks into this many pretend hosts (consecutive blocks) for dpar's group: its "
        "hierarchical ring, shared memory within blocks and TCP between them, on this machine");
    auto& op_name = flags.add_string(
        "op", "allreduce", "--device cpu: allreduce, reduce_scatter, allgather or broadcast");
    auto& launcher = flags.add_string("launcher", DPAR_LAUNCH_PATH, "dpar-launch to start ranks");
    auto& start_port = flags.add_int("start-port", 0, "dpar-launch --start_port (0: a free one)");
    auto& worker = flags.add_bool("worker", false, "run as a rank (set by the driver)");
    auto& recorder = flags.add_bool(
        "recorder", false, "only measure the flight recorder's cost per collective (one process)");
    flags.parse(argc, argv);
    if (recorder) return run_recorder_bench();
    DPAR_CHECK(max_mb >= 0 && min_seconds > 0 && reps >= 1 && nproc >= 2,
               "bench_allreduce: --max-mb, --min-seconds, --reps must be positive, --nproc >= 2");
    DPAR_CHECK(hosts >= 1, "bench_allreduce: --hosts=", hosts, ": expected 1 or more");
    const bool gpu = device == "gpu";
    DPAR_CHECK(op_name == "allreduce" || op_name == "reduce_scatter" || op_name == "allgather" ||
                   op_name == "broadcast",
               "bench_allreduce: --op=", op_name,
               ": expected allreduce, reduce_scatter, allgather or broadcast");
    DPAR_CHECK(!gpu || op_name == "allreduce", "bench_allreduce: --op ", op_name,
               " is measured on --device cpu only");
    DPAR_CHECK(!gpu || hosts == 1, "bench_allreduce: --hosts is measured on --device cpu only");
    DPAR_CHECK(gpu || device == "cpu", "bench_allreduce: --device=", device,
               ": expected cpu or gpu");
    DPAR_CHECK(!gpu || built_with_cuda(),
               "bench_allreduce: --device gpu: dpar was built without CUDA");
    const double largest = max_mb > 0 ? max_mb : gpu ? 256 : 64;

    const char* env_rank = std::getenv("DPAR_RANK");
    if (!worker && (env_rank == nullptr || *env_rank == '\0')) {
      if (gpu && gpu_index >= 0) {
        // Ranks sharing one GPU reach each other over NCCL's socket transport on loopback.
        setenv("NCCL_SOCKET_IFNAME", "lo", 0);
        setenv("NCCL_P2P_DISABLE", "1", 0);
        setenv("NCCL_SHM_DISABLE", "1", 0);
        setenv("NCCL_IB_DISABLE", "1", 0);
      }
      const int port = start_port > 0 ? static_cast<int>(start_port)
                                      : bench::pick_free_ports(static_cast<int>(nproc) + 1);
      exec_launcher(launcher, port, static_cast<int>(nproc), argc, argv);
    }
    if (gpu) {
#ifdef DPAR_BENCH_WITH_NCCL
      return bench::run_gpu_allreduce_worker(
          {largest, reps, static_cast<int>(gpu_index), static_cast<bool>(peer), max_iters});
#endif
    }
    bench::Collective op = bench::Collective::allreduce;
    for (auto c : {bench::Collective::allreduce, bench::Collective::reduce_scatter,
                   bench::Collective::allgather, bench::Collective::broadcast}) {
      if (op_name == bench::collective_name(c)) op = c;
    }
    return run_worker(
        {largest, min_seconds, reps, check, diag, async, mpi, op, static_cast<int>(hosts)});
  });
}
